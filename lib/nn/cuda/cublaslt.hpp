// Private: the cuBLASLt matrix multiply behind the linear op (lib/nn/cuda/linear.cu).
//
// The handle and the stream's workspace come from the registry of cublas_handles.hpp (no
// allocation per call). The algorithm chosen by cuBLASLt's heuristic is cached per problem
// (shapes, dtypes, alignments, epilogue). Thread-safe. C++17.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <optional>

#include "quintet/core/stream.hpp"

namespace quintet::nn::cuda_ops::detail {

// D = alpha * op(A) · op(B) + beta * C (+ bias), column-major as cuBLAS counts it, C == D in
// place. Sizes in elements: op(A) is m×k, op(B) is k×n, D is m×n with leading dimension ldd.
// A is stored k×m when trans_a (else m×k), likewise B. bias (optional): m values of the D type,
// added to every column (CUBLASLT_EPILOGUE_BIAS). bias_grad (optional, not with bias): n f32
// values overwritten with the sums of op(B) over k, each column's (CUBLASLT_EPILOGUE_BGRADB: the
// bias gradient of a weight-gradient product, read from B as the product reads it). Runs on
// stream; device current.
// FP8 (ab_type CUDA_R_8F_E4M3 or _E5M2): cuBLASLt's FP8 kernels take only trans_a and !trans_b
// ("TN"); b_type is B's type when it differs from A's (E4M3 by E5M2), a_scale and b_scale device
// f32 multipliers of A and B (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER: the inverse scales), and
// fast_accum CUBLASLT_MATMUL_DESC_FAST_ACCUM (off: the products are accumulated in full f32).
struct LtMatmul {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* d = nullptr;
  std::int64_t ldd = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // A and B
  cudaDataType_t d_type = CUDA_R_32F;   // C and D (and the bias)
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* bias = nullptr;
  void* bias_grad = nullptr;
  std::optional<cudaDataType_t> b_type;  // B's type when not ab_type
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accum = false;
};

// Queues the multiply on stream; throws Cuda when cuBLASLt fails or finds no algorithm.
void lt_matmul(const LtMatmul& mm, const Stream& stream);
// The same, but returns false (queuing nothing) when cuBLASLt has no algorithm for it — for
// epilogues that are an optimisation with a fallback.
bool try_lt_matmul(const LtMatmul& mm, const Stream& stream);

}  // namespace quintet::nn::cuda_ops::detail
