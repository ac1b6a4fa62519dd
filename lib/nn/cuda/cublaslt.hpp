// Private: the cuBLASLt matrix multiply behind the linear op (lib/nn/cuda/linear.cu).
//
// The handle and the stream's workspace come from the registry of cublas_handles.hpp (no
// allocation per call). The algorithm chosen by cuBLASLt's heuristic is cached per problem
// (shapes, dtypes, alignments, epilogue). Thread-safe. C++17.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "quintet/core/stream.hpp"

namespace quintet::nn::cuda_ops::detail {

// D = alpha * op(A) · op(B) + beta * C (+ bias), column-major as cuBLAS counts it, C == D in
// place. Sizes in elements: op(A) is m×k, op(B) is k×n, D is m×n with leading dimension ldd.
// A is stored k×m when trans_a (else m×k), likewise B. bias (optional): m values of the D type,
// added to every column (CUBLASLT_EPILOGUE_BIAS). bias_grad (optional, not with bias): n f32
// values overwritten with the sums of op(B) over k, each column's (CUBLASLT_EPILOGUE_BGRADB: the
// bias gradient of a weight-gradient product, read from B as the product reads it). Runs on
// stream; device current.
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
};

// Queues the multiply on stream; throws Cuda when cuBLASLt fails or finds no algorithm.
void lt_matmul(const LtMatmul& mm, const Stream& stream);
// The same, but returns false (queuing nothing) when cuBLASLt has no algorithm for it — for
// epilogues that are an optimisation with a fallback.
bool try_lt_matmul(const LtMatmul& mm, const Stream& stream);

}  // namespace quintet::nn::cuda_ops::detail
