// The algorithm cache of lt_matmul (see cublaslt.hpp); handles and workspaces come from
// cublas_handles.hpp.
#include "nn/cuda/cublaslt.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "nn/cuda/cublas_handles.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::nn::cuda_ops::detail {

namespace {

// The problem an algorithm was chosen for. Alignments (bytes, power of two <= 256) are part of it
// because cuBLASLt's fast kernels need aligned pointers and odd shapes need other kernels.
using AlgoKey = std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, std::int64_t, int, int, bool, bool, bool, unsigned,
                           unsigned, unsigned, int, bool, bool>;

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// Process-wide, never destroyed (like the handles it is used with). An entry without a value: no
// algorithm exists for that problem.
struct AlgoCache {
  std::mutex mutex;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache* c = new AlgoCache;
  return *c;
}

unsigned alignment_of(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  unsigned a = 256;
  while (a > 1 && (u % a) != 0) a >>= 1;
  return a;
}

// RAII owners of the per-call descriptors (cheap host objects).
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  ~MatmulDesc() {
    if (h) cublasLtMatmulDescDestroy(h);
  }
};
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  ~Layout() {
    if (h) cublasLtMatrixLayoutDestroy(h);
  }
};
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  ~Preference() {
    if (h) cublasLtMatmulPreferenceDestroy(h);
  }
};

}  // namespace

void lt_matmul(const LtMatmul& mm, const Stream& stream) {
  if (try_lt_matmul(mm, stream)) return;
  QUINTET_THROW(Cuda,
                "cuBLASLt found no algorithm for m={} n={} k={} (lda={} ldb={} ldd={}, transa={} "
                "transb={}, A/B type {}/{}, D type {}, alignments {}/{}/{} bytes)",
                mm.m, mm.n, mm.k, mm.lda, mm.ldb, mm.ldd, mm.trans_a, mm.trans_b,
                static_cast<int>(mm.ab_type), static_cast<int>(mm.b_type.value_or(mm.ab_type)),
                static_cast<int>(mm.d_type), alignment_of(mm.a), alignment_of(mm.b),
                alignment_of(mm.d));
}

bool try_lt_matmul(const LtMatmul& mm, const Stream& stream) {
  const int device = stream.device().index();
  const cudaStream_t s = stream.handle();
  const cublasLtHandle_t handle = cublaslt_handle(stream);
  void* const workspace = cublas_workspace(stream);
  AlgoCache& cache = algo_cache();

  MatmulDesc desc;
  QUINTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  QUINTET_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  QUINTET_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const cudaDataType_t b_type = mm.b_type.value_or(mm.ab_type);
  const bool fp8 = is_fp8(mm.ab_type) || is_fp8(b_type);
  if (fp8) {
    const std::int8_t fast = mm.fast_accum ? 1 : 0;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                        &fast, sizeof fast));
  }
  if (mm.a_scale != nullptr) {
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.h, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &mm.a_scale, sizeof mm.a_scale));
  }
  if (mm.b_scale != nullptr) {
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.h, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &mm.b_scale, sizeof mm.b_scale));
  }
  if (mm.bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    QUINTET_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &mm.bias, sizeof mm.bias));
    const cudaDataType_t bias_type = mm.d_type;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                        &bias_type, sizeof bias_type));
  } else if (mm.bias_grad != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BGRADB;
    QUINTET_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &mm.bias_grad, sizeof mm.bias_grad));
    const cudaDataType_t grad_type = CUDA_R_32F;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                        &grad_type, sizeof grad_type));
  }

  // Stored shapes: A is k×m when transposed, else m×k (rows, cols in column-major order).
  Layout la, lb, ld;
  QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.h, mm.ab_type, mm.trans_a ? mm.k : mm.m,
                                                  mm.trans_a ? mm.m : mm.k, mm.lda));
  QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.h, b_type, mm.trans_b ? mm.n : mm.k,
                                                  mm.trans_b ? mm.k : mm.n, mm.ldb));
  QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld.h, mm.d_type, mm.m, mm.n, mm.ldd));

  const void* vector = mm.bias != nullptr ? mm.bias : mm.bias_grad;
  const unsigned align_a = alignment_of(mm.a), align_b = alignment_of(mm.b),
                 align_d = std::min(alignment_of(mm.d), vector ? alignment_of(vector) : 256u);
  const AlgoKey key{device,
                    mm.trans_a,
                    mm.trans_b,
                    mm.m,
                    mm.n,
                    mm.k,
                    mm.lda,
                    mm.ldb,
                    mm.ldd,
                    mm.ab_type,
                    mm.d_type,
                    mm.beta != 0.0f,
                    mm.bias != nullptr,
                    mm.bias_grad != nullptr,
                    align_a,
                    align_b,
                    align_d,
                    b_type,
                    mm.a_scale != nullptr || mm.b_scale != nullptr,
                    mm.fast_accum};
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
    const std::size_t ws = kCublasWorkspaceBytes;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const std::uint32_t aa = align_a, ab = align_b, ad = align_d;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    // FP8: several candidates, since cuBLASLt's heuristic may offer an FP8 algorithm that
    // cublasLtMatmul then refuses (CUBLAS_STATUS_NOT_SUPPORTED); the first one it runs is kept.
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates];
    std::memset(results, 0, sizeof results);
    int found = 0;
    // An unsupported epilogue may be refused here rather than by finding nothing; so may an FP8
    // problem cuBLASLt does not take (a type combination, a GPU before sm_89), which the caller
    // then computes otherwise.
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, fp8 ? kCandidates : 1, results, &found);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED && !fp8) QUINTET_CUBLAS_CHECK(status);
    if (status == CUBLAS_STATUS_SUCCESS) {
      for (int i = 0; i < found && !algo; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        if (!fp8) {
          algo = results[i].algo;
          break;
        }
        // Run here, on the caller's operands: a refusal writes nothing, a success is the
        // product asked for.
        const cublasStatus_t run =
            cublasLtMatmul(handle, desc.h, &mm.alpha, mm.a, la.h, mm.b, lb.h, &mm.beta, mm.d, ld.h,
                           mm.d, ld.h, &results[i].algo, workspace, kCublasWorkspaceBytes, s);
        if (run == CUBLAS_STATUS_NOT_SUPPORTED) continue;
        QUINTET_CUBLAS_CHECK(run);
        algo = results[i].algo;
        std::lock_guard<std::mutex> lock(cache.mutex);
        cache.algos.emplace(key, algo);
        return true;
      }
    }
    if (fp8 && found > 0) {  // offered and all refused: the caller's slow path, said once
      static std::once_flag warned;
      std::call_once(warned, [&] {
        log::warn(
            "cuBLASLt offered {} FP8 algorithms for m={} n={} k={} and ran none "
            "(CUBLAS_STATUS_NOT_SUPPORTED): such FP8 products are computed in f32 from "
            "dequantised operands, several times slower",
            found, mm.m, mm.n, mm.k);
      });
    }
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.algos.emplace(key, algo);
  }
  if (!algo) return false;
  QUINTET_CUBLAS_CHECK(cublasLtMatmul(handle, desc.h, &mm.alpha, mm.a, la.h, mm.b, lb.h, &mm.beta,
                                      mm.d, ld.h, mm.d, ld.h, &*algo, workspace,
                                      kCublasWorkspaceBytes, s));
  return true;
}

}  // namespace quintet::nn::cuda_ops::detail
