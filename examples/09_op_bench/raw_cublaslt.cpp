// RawLtGemm: see raw_cublaslt.hpp.
#include "raw_cublaslt.hpp"

#include <stdexcept>
#include <string>

namespace {
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasLtGetStatusString(s));
  }
}
}  // namespace

RawLtGemm::RawLtGemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                     const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* d,
                     std::int64_t ldd, cudaDataType_t d_type, float beta, const void* bias)
    : a_(a), b_(b), d_(d), beta_(beta) {
  check(cublasLtCreate(&handle_), "cublasLtCreate");
  check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "TRANSA");
  check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "TRANSB");
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
          "EPILOGUE");
    check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof bias),
          "BIAS_POINTER");
  }
  check(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda), "A");
  check(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb), "B");
  check(cublasLtMatrixLayoutCreate(&ld_, d_type, m, n, ldd), "D");
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess) {
    throw std::runtime_error("cudaMalloc of the cuBLASLt workspace failed");
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof workspace_bytes_),
        "MAX_WORKSPACE");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check(
      cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, ld_, ld_, pref, 1, &result, &found),
      "AlgoGetHeuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm");
  algo_ = result.algo;
}

RawLtGemm::~RawLtGemm() {
  cudaFree(workspace_);
  cublasLtMatrixLayoutDestroy(ld_);
  cublasLtMatrixLayoutDestroy(lb_);
  cublasLtMatrixLayoutDestroy(la_);
  cublasLtMatmulDescDestroy(desc_);
  cublasLtDestroy(handle_);
}

void RawLtGemm::run(cudaStream_t stream) {
  check(cublasLtMatmul(handle_, desc_, &alpha_, a_, la_, b_, lb_, &beta_, d_, ld_, d_, ld_, &algo_,
                       workspace_, workspace_bytes_, stream),
        "cublasLtMatmul");
}
