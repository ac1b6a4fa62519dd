// The kernels of the router's functions (moe_kernels.hpp): the aux loss from its statistics and
// the step's load. Every sum that lands in a result runs in a fixed order, so a run repeats bit for
// bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "parallel/expert/cuda/moe_kernels.hpp"
#include "quintet/core/error.hpp"

namespace quintet::expert::cuda {

namespace {

constexpr int kThreads = 256;

void check(cudaError_t e, const char* what) {
  QUINTET_CHECK(e == cudaSuccess, "MoE kernels: {} failed: {}", what, cudaGetErrorString(e));
}
void check_launch(const char* what) { check(cudaGetLastError(), what); }

unsigned grid_for(std::int64_t n) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}
__device__ __forceinline__ std::int64_t index0() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

__global__ void aux_loss_kernel(const float* counts, const float* prob_sum, std::int64_t G,
                                std::int64_t E, double n, int k, double coeff, double* acc) {
  double total = 0.0;
  for (std::int64_t g = 0; g < G; ++g) {
    double l = 0.0;
    for (std::int64_t e = 0; e < E; ++e) {
      l += (counts[g * E + e] / (n * k)) * (prob_sum[g * E + e] / n);
    }
    total += static_cast<double>(E) * l;
  }
  if (G > 0) acc[0] += coeff * total / static_cast<double>(G);
}

__global__ void add_counts_kernel(const std::int64_t* counts, std::int64_t n, double* acc) {
  for (std::int64_t i = index0(); i < n; i += stride()) acc[i] += static_cast<double>(counts[i]);
}

}  // namespace

void aux_loss(const Tensor& counts, const Tensor& prob_sum, double group_tokens, int top_k,
              double coeff, const Tensor& acc, const Stream& stream) {
  aux_loss_kernel<<<1, 1, 0, stream.handle()>>>(
      ptr<const float>(counts), ptr<const float>(prob_sum), counts.size(0), counts.size(1),
      group_tokens, top_k, coeff, ptr<double>(acc));
  check_launch("aux loss");
}

void add_counts(const Tensor& counts, const Tensor& acc, const Stream& stream) {
  const std::int64_t n = counts.numel();
  if (n == 0) return;
  add_counts_kernel<<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<const std::int64_t>(counts),
                                                                   n, ptr<double>(acc));
  check_launch("add counts");
}

}  // namespace quintet::expert::cuda
