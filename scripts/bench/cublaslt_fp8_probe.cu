// Which FP8 matrix products cuBLASLt takes on this GPU and cuBLAS, one line per form: the
// heuristic's status and candidates, then cublasLtMatmul's status for each candidate. On an H200
// with cuBLAS 13 (2026-12-05) every FP8 product of lib/nn/cuda/fp8.cu was offered by the
// heuristic and then refused by cublasLtMatmul (CUBLAS_STATUS_NOT_SUPPORTED); this names which
// of the product's settings is the cause. The forms vary one setting at a time from the one
// fp8_gemm makes (lib/nn/cuda/cublaslt.cu): "TN" operands, bf16 D written in place over C, the
// bias epilogue, fast accumulation, device scale pointers at an offset of one float (fp8_gemm's
// scale tensors hold {scale, 1 / scale}), the E4M3 x E5M2 mixes of the backward, f32 output
// accumulated (beta 1), and larger shapes. Built and run by scripts/device_session.sh 0:
//
//   nvcc -std=c++17 -arch=sm_90 scripts/bench/cublaslt_fp8_probe.cu -lcublasLt -o probe
//   CUBLASLT_LOG_LEVEL=2 ./probe        (level 2: cuBLASLt says why it refuses, on stdout)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

struct Form {
  const char* name;
  int m, n, k;
  cudaDataType_t a, b, d;
  bool bias, fast, scales, separate_c;
  float beta;
  int scale_offset;  // floats from a 256-byte aligned allocation
};

void* device_zeros(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  cudaMemset(p, 0, bytes);
  return p;
}

// One form, printing what cuBLASLt said of it.
void probe(cublasLtHandle_t handle, const Form& f, void* workspace, std::size_t workspace_bytes,
           void* a, void* b, void* c, void* d, void* bias, float* scales) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // the "TN" FP8 kernels take
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  const std::int8_t fast = f.fast ? 1 : 0;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
  const float* scale = scales + f.scale_offset;
  if (f.scales) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale,
                                   sizeof scale);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale,
                                   sizeof scale);
  }
  if (f.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    const cudaDataType_t bias_type = f.d;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                   sizeof bias_type);
  }
  // A stored k x m (transposed), B k x n, C and D m x n, all column-major.
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatrixLayoutCreate(&la, f.a, f.k, f.m, f.k);
  cublasLtMatrixLayoutCreate(&lb, f.b, f.k, f.n, f.k);
  cublasLtMatrixLayoutCreate(&lc, f.d, f.m, f.n, f.m);
  cublasLtMatrixLayoutCreate(&ld, f.d, f.m, f.n, f.m);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof workspace_bytes);
  constexpr int kMax = 8;
  cublasLtMatmulHeuristicResult_t results[kMax] = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      handle, desc, la, lb, f.separate_c ? lc : ld, ld, pref, kMax, results, &found);
  std::printf("%-34s heuristic %-28s %d found; matmul:", f.name, cublasLtGetStatusName(heuristic),
              found);
  const float alpha = 1.0f, beta = f.beta;
  for (int i = 0; i < found; ++i) {
    const cublasStatus_t run = cublasLtMatmul(
        handle, desc, &alpha, a, la, b, lb, &beta, f.separate_c ? c : d, f.separate_c ? lc : ld, d,
        ld, &results[i].algo, workspace, workspace_bytes, nullptr);
    std::printf(" %s", run == CUBLAS_STATUS_SUCCESS ? "ok" : cublasLtGetStatusName(run));
  }
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("%s\n", sync == cudaSuccess ? "" : cudaGetErrorString(sync));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA GPU visible\n");
    return 1;
  }
  std::printf("%s (sm_%d%d), cuBLASLt %zu, CUDA runtime %zu\n", prop.name, prop.major, prop.minor,
              cublasLtGetVersion(), cublasLtGetCudartVersion());
  cublasLtHandle_t handle = nullptr;
  cublasLtCreate(&handle);
  const std::size_t workspace_bytes = 32u << 20, operand_bytes = 64u << 20;
  void* workspace = device_zeros(workspace_bytes);
  void* a = device_zeros(operand_bytes);
  void* b = device_zeros(operand_bytes);
  void* c = device_zeros(operand_bytes);
  void* d = device_zeros(operand_bytes);
  void* bias = device_zeros(1u << 20);
  auto* scales = static_cast<float*>(device_zeros(16 * sizeof(float)));
  if (!workspace || !a || !b || !c || !d || !bias || !scales) {
    std::printf("cudaMalloc failed\n");
    return 1;
  }
  const std::vector<float> ones(16, 1.0f);
  cudaMemcpy(scales, ones.data(), 16 * sizeof(float), cudaMemcpyHostToDevice);
  const cudaDataType_t e4 = CUDA_R_8F_E4M3, e5 = CUDA_R_8F_E5M2, bf = CUDA_R_16BF, f32 = CUDA_R_32F;
  // name, m, n, k, A, B, D, bias, fast, scales, separate C, beta, scale offset
  const std::vector<Form> forms = {
      {"forward as fp8_gemm (bias, fast)", 48, 64, 128, e4, e4, bf, true, true, true, false, 0, 1},
      {"forward, no bias", 48, 64, 128, e4, e4, bf, false, true, true, false, 0, 1},
      {"forward, not fast", 48, 64, 128, e4, e4, bf, true, false, true, false, 0, 1},
      {"forward, no scales, no bias", 48, 64, 128, e4, e4, bf, false, true, false, false, 0, 1},
      {"forward, C apart from D", 48, 64, 128, e4, e4, bf, true, true, true, true, 0, 1},
      {"forward, scales aligned", 48, 64, 128, e4, e4, bf, true, true, true, false, 0, 0},
      {"forward, scales 16-byte aligned", 48, 64, 128, e4, e4, bf, true, true, true, false, 0, 4},
      {"forward, no bias, scales aligned", 48, 64, 128, e4, e4, bf, false, true, true, false, 0, 0},
      {"dgrad E5M2 x E4M3", 48, 64, 128, e5, e4, bf, false, false, true, false, 0, 1},
      {"dgrad E4M3 x E5M2", 48, 64, 128, e4, e5, bf, false, false, true, false, 0, 1},
      {"dgrad, scales aligned", 48, 64, 128, e5, e4, bf, false, false, true, false, 0, 0},
      {"wgrad f32 out, beta 1", 48, 64, 128, e4, e5, f32, false, false, true, false, 1, 1},
      {"wgrad, scales aligned", 48, 64, 128, e4, e5, f32, false, false, true, false, 1, 0},
      {"f32 out with bias", 48, 64, 128, e5, e4, f32, true, false, true, false, 0, 1},
      {"large forward (bias, fast)", 1024, 2048, 1024, e4, e4, bf, true, true, true, false, 0, 1},
      {"large forward, no bias", 1024, 2048, 1024, e4, e4, bf, false, true, true, false, 0, 1},
      {"large forward, scales aligned", 1024, 2048, 1024, e4, e4, bf, true, true, true, false, 0,
       0},
      {"large forward, no scales", 1024, 2048, 1024, e4, e4, bf, false, true, false, false, 0, 0},
      {"large, C apart from D", 1024, 2048, 1024, e4, e4, bf, false, true, true, true, 0, 1},
      {"large f32 out", 1024, 2048, 1024, e4, e4, f32, false, false, true, false, 0, 1},
  };
  for (const Form& f : forms)
    probe(handle, f, workspace, workspace_bytes, a, b, c, d, bias, scales);
  cublasLtDestroy(handle);
  return 0;
}
