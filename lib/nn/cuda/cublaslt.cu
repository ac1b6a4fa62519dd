// cuBLASLt handles, workspaces and the algorithm cache of lt_matmul (see cublaslt.hpp).
#include "nn/cuda/cublaslt.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "quintet/core/allocator.hpp"
#include "quintet/core/error.hpp"

namespace quintet::nn::cuda_ops::detail {

namespace {

// 32 MiB: what NVIDIA recommends for cuBLASLt on Hopper; enough for split-K algorithms.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

#define QUINTET_LT_CHECK(call)                                                                    \
  do {                                                                                            \
    const cublasStatus_t quintet_lt_status_ = (call);                                             \
    if (quintet_lt_status_ != CUBLAS_STATUS_SUCCESS) {                                            \
      QUINTET_THROW(Cuda, "{} failed: {} ({})", #call, cublasLtGetStatusName(quintet_lt_status_), \
                    cublasLtGetStatusString(quintet_lt_status_));                                 \
    }                                                                                             \
  } while (0)

// The problem an algorithm was chosen for. Alignments (bytes, power of two <= 256) are part of it
// because cuBLASLt's fast kernels need aligned pointers and odd shapes need other kernels.
using AlgoKey =
    std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
               std::int64_t, std::int64_t, int, int, bool, bool, unsigned, unsigned, unsigned>;

// Process-wide state. Never destroyed: the workspaces are pooled device memory and the handles
// belong to CUDA contexts, and freeing either during static destruction would race the CUDA
// runtime's own teardown.
struct Registry {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;                                   // by device
  std::map<std::pair<int, cudaStream_t>, std::shared_ptr<void>> workspaces;  // by device, stream
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
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
  const int device = stream.device().index();
  const cudaStream_t s = stream.handle();
  Registry& reg = registry();
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto h = reg.handles.find(device);
    if (h == reg.handles.end()) {
      cublasLtHandle_t created = nullptr;
      QUINTET_LT_CHECK(cublasLtCreate(&created));
      h = reg.handles.emplace(device, created).first;
    }
    handle = h->second;
    auto w = reg.workspaces.find({device, s});
    if (w == reg.workspaces.end()) {
      w = reg.workspaces
              .emplace(std::make_pair(device, s),
                       cuda_allocate(kWorkspaceBytes, stream.device(), stream))
              .first;
    }
    workspace = w->second.get();
  }

  MatmulDesc desc;
  QUINTET_LT_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  QUINTET_LT_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  QUINTET_LT_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (mm.bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    QUINTET_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    QUINTET_LT_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &mm.bias, sizeof mm.bias));
    const cudaDataType_t bias_type = mm.d_type;
    QUINTET_LT_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_type, sizeof bias_type));
  }

  // Stored shapes: A is k×m when transposed, else m×k (rows, cols in column-major order).
  Layout la, lb, ld;
  QUINTET_LT_CHECK(cublasLtMatrixLayoutCreate(&la.h, mm.ab_type, mm.trans_a ? mm.k : mm.m,
                                              mm.trans_a ? mm.m : mm.k, mm.lda));
  QUINTET_LT_CHECK(cublasLtMatrixLayoutCreate(&lb.h, mm.ab_type, mm.trans_b ? mm.n : mm.k,
                                              mm.trans_b ? mm.k : mm.n, mm.ldb));
  QUINTET_LT_CHECK(cublasLtMatrixLayoutCreate(&ld.h, mm.d_type, mm.m, mm.n, mm.ldd));

  const unsigned align_a = alignment_of(mm.a), align_b = alignment_of(mm.b),
                 align_d = std::min(alignment_of(mm.d), mm.bias ? alignment_of(mm.bias) : 256u);
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
                    align_a,
                    align_b,
                    align_d};
  cublasLtMatmulAlgo_t algo;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.algos.find(key);
    if (it != reg.algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref;
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
    const std::size_t ws = kWorkspaceBytes;
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const std::uint32_t aa = align_a, ab = align_b, ad = align_d;
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    QUINTET_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    cublasLtMatmulHeuristicResult_t result;
    std::memset(&result, 0, sizeof result);
    int found = 0;
    QUINTET_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.h, la.h, lb.h, ld.h, ld.h, pref.h,
                                                    1, &result, &found));
    if (found == 0) {
      QUINTET_THROW(Cuda,
                    "cuBLASLt found no algorithm for m={} n={} k={} (lda={} ldb={} ldd={}, "
                    "transa={} transb={}, A/B type {}, D type {}, alignments {}/{}/{} bytes)",
                    mm.m, mm.n, mm.k, mm.lda, mm.ldb, mm.ldd, mm.trans_a, mm.trans_b,
                    static_cast<int>(mm.ab_type), static_cast<int>(mm.d_type), align_a, align_b,
                    align_d);
    }
    algo = result.algo;
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.algos.emplace(key, algo);
  }
  QUINTET_LT_CHECK(cublasLtMatmul(handle, desc.h, &mm.alpha, mm.a, la.h, mm.b, lb.h, &mm.beta, mm.d,
                                  ld.h, mm.d, ld.h, &algo, workspace, kWorkspaceBytes, s));
}

}  // namespace quintet::nn::cuda_ops::detail
