// The baseline of the experts benchmark: many GEMMs of different shapes in one
// cublasGemmGroupedBatchedEx call (cuBLAS >= 12.5), set up once so the timed call is the cuBLAS
// call alone. Problems of one shape form one group (or each problem its own group); the device
// arrays of matrix pointers are built once, with a variant that copies them to the device before
// every call, as a layer whose per-expert row counts change every step would have to.
//
// What cuBLAS accepts (its documentation, checked against cuBLAS 13.1): A/B and C of the same
// type, bf16, f16 or f32, with CUBLAS_COMPUTE_32F and f32 alpha/beta (f32 also with _PEDANTIC and
// _FAST_TF32; f64 with COMPUTE_64F). bf16 A/B with an f32 C is not in that list: try_run reports
// CUBLAS_STATUS_NOT_SUPPORTED for it. alpha/beta are host scalars (a device pointer mode is
// not supported); every other per-group array is a host array, the matrix pointers are device
// arrays.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

// One column-major GEMM, as cuBLAS counts it: C (m×n, leading dimension ldc) =
// alpha·op(A)·op(B) + beta·C, with op(A) m×k and op(B) k×n; A is stored k×m when trans_a (else
// m×k), likewise B. Sizes in elements; pointers are device memory.
struct GemmProblem {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* c = nullptr;
  std::int64_t ldc = 0;
};

// How the problems are split into cuBLAS groups.
enum class Grouping {
  by_shape,     // one group per distinct (transposes, m, n, k, leading dimensions)
  per_problem,  // one group per problem, group_size 1 each
};

// The problems of one grouped call, all with A/B of ab_type, C of c_type, f32 accumulation
// (CUBLAS_COMPUTE_32F), alpha 1 and the given beta. Problems with m, n or k of 0 are dropped
// (their C is left as it is, which is what beta = 1 means; with beta = 0 the caller must have
// zeroed it). Owns its cuBLAS handle, the device pointer arrays and a pinned host copy of them;
// the matrices are the caller's and must stay valid while the object is used. Not thread-safe.
class GroupedGemm {
 public:
  GroupedGemm(const std::vector<GemmProblem>& problems, cudaDataType_t ab_type,
              cudaDataType_t c_type, float beta, Grouping grouping);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Queues the grouped multiply on stream and returns cuBLAS's status (NOT_SUPPORTED for a type
  // combination it lacks), without throwing.
  cublasStatus_t try_run(cudaStream_t stream);
  // Queues the grouped multiply on stream; throws std::runtime_error when cuBLAS fails.
  void run(cudaStream_t stream);
  // Queues an asynchronous copy of the pointer arrays (pinned host -> device, one copy) and then
  // the multiply, both on stream: the cost a layer pays when it rebuilds them every step.
  void upload_and_run(cudaStream_t stream);
  // Zeroes the device pointer arrays on stream (to check that upload_and_run's copy is what the
  // multiply reads).
  void clear_device_pointers(cudaStream_t stream);

  int group_count() const { return static_cast<int>(group_size_.size()); }
  int problem_count() const { return problems_; }
  // 2·m·n·k summed over the problems.
  double flops() const { return flops_; }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaDataType_t ab_type_, c_type_;
  // Per group (host arrays, as cuBLAS wants them).
  std::vector<cublasOperation_t> trans_a_, trans_b_;
  std::vector<int> m_, n_, k_, lda_, ldb_, ldc_, group_size_;
  std::vector<float> alpha_, beta_;
  // Per problem, ordered group by group: [A pointers | B pointers | C pointers].
  int problems_ = 0;
  double flops_ = 0.0;
  void** device_ptrs_ = nullptr;
  void** host_ptrs_ = nullptr;  // pinned
};
