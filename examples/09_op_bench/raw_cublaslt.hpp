// The baseline of the linear benchmark: one bf16 GEMM called straight through cuBLASLt, set up
// once (descriptors, heuristic's best algorithm, its own 32 MiB workspace) so the timed loop is
// the cublasLtMatmul call alone — what a user calling cuBLASLt by hand would get.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

// D (m×n, column-major, type d_type) = op(A)·op(B) + beta·D (+ bias of m d_type values), with
// A/B bf16 and f32 accumulation. Sizes in elements. Pointers are device memory owned by the
// caller and must stay valid while run() is used.
class RawLtGemm {
 public:
  RawLtGemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
            const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* d,
            std::int64_t ldd, cudaDataType_t d_type, float beta, const void* bias);
  ~RawLtGemm();
  RawLtGemm(const RawLtGemm&) = delete;
  RawLtGemm& operator=(const RawLtGemm&) = delete;

  // Queues one multiply on stream.
  void run(cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, ld_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t{32} << 20;
  const void* a_;
  const void* b_;
  void* d_;
  float alpha_ = 1.0f, beta_;
};
