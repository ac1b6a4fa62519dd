// The kernels of the router's step-by-step functions (moe_kernels.hpp): the weights' and the
// scores' backward and the load-balancing terms. Every sum that lands in a result runs in a fixed
// order, so a run repeats bit for bit.
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

// ---- routing ------------------------------------------------------------------------------

__device__ __forceinline__ float row_lse(const float* row, std::int64_t E) {
  float m = row[0];
  for (std::int64_t e = 1; e < E; ++e) m = fmaxf(m, row[e]);
  float s = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) s += expf(row[e] - m);
  return m + logf(s);
}

__global__ void weights_backward_kernel(const float* probs, const std::int32_t* experts,
                                        const std::uint8_t* kept, const float* dw, std::int64_t T,
                                        std::int64_t E, int k, bool renormalize, float* dprobs) {
  for (std::int64_t t = index0(); t < T; t += stride()) {
    const std::int64_t a0 = t * k;
    if (!renormalize) {
      for (int j = 0; j < k; ++j) {
        if (kept[a0 + j] != 0) dprobs[t * E + experts[a0 + j]] += dw[a0 + j];
      }
      continue;
    }
    double S = 0.0, gp = 0.0;
    for (int j = 0; j < k; ++j) S += probs[t * E + experts[a0 + j]];
    for (int j = 0; j < k; ++j) {
      if (kept[a0 + j] != 0) gp += static_cast<double>(dw[a0 + j]) * probs[t * E + experts[a0 + j]];
    }
    for (int j = 0; j < k; ++j) {
      const double g = kept[a0 + j] != 0 ? dw[a0 + j] : 0.0;
      dprobs[t * E + experts[a0 + j]] += static_cast<float>(g / S - gp / (S * S));
    }
  }
}

__global__ void scores_backward_kernel(const float* probs, const float* dprobs, std::int64_t T,
                                       std::int64_t E, bool softmax, float* dlogits) {
  for (std::int64_t t = index0(); t < T; t += stride()) {
    const float* p = probs + t * E;
    const float* d = dprobs + t * E;
    float* o = dlogits + t * E;
    if (softmax) {
      double dot = 0.0;
      for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(p[e]) * d[e];
      for (std::int64_t e = 0; e < E; ++e) o[e] = static_cast<float>(p[e] * (d[e] - dot));
    } else {
      for (std::int64_t e = 0; e < E; ++e) o[e] = d[e] * p[e] * (1.0f - p[e]);
    }
  }
}

// One thread per (group, expert), over the group's tokens in order.
__global__ void aux_stats_kernel(const float* probs, const std::int32_t* experts, std::int64_t G,
                                 std::int64_t n, std::int64_t E, int k, float* counts,
                                 float* prob_sum) {
  for (std::int64_t ge = index0(); ge < G * E; ge += stride()) {
    const std::int64_t g = ge / E, e = ge % E;
    float c = 0.0f, s = 0.0f;
    for (std::int64_t t = g * n; t < (g + 1) * n; ++t) {
      s += probs[t * E + e];
      for (int j = 0; j < k; ++j) c += experts[t * k + j] == e ? 1.0f : 0.0f;
    }
    counts[ge] = c;
    prob_sum[ge] = s;
  }
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

__global__ void aux_grad_kernel(const float* counts, std::int64_t T, std::int64_t G, std::int64_t E,
                                double factor, float* dprobs) {
  const std::int64_t local = T / G;
  for (std::int64_t i = index0(); i < T * E; i += stride()) {
    const std::int64_t t = i / E, e = i % E;
    dprobs[i] += static_cast<float>(factor * counts[(t / local) * E + e]);
  }
}

// One block: the sum of lse^2 over the tokens, in a fixed order.
__global__ void z_loss_kernel(const float* logits, std::int64_t T, std::int64_t E, double coeff,
                              double* acc) {
  __shared__ double part[kThreads];
  double s = 0.0;
  for (std::int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const double l = row_lse(logits + t * E, E);
    s += l * l;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) acc[0] += coeff * part[0] / static_cast<double>(T);
}

__global__ void z_grad_kernel(const float* logits, std::int64_t T, std::int64_t E, double factor,
                              float* dlogits) {
  for (std::int64_t t = index0(); t < T; t += stride()) {
    const float* row = logits + t * E;
    const float lse = row_lse(row, E);
    const float f = static_cast<float>(factor * 2.0) * lse;
    for (std::int64_t e = 0; e < E; ++e) dlogits[t * E + e] += f * expf(row[e] - lse);
  }
}

__global__ void add_counts_kernel(const std::int64_t* counts, std::int64_t n, double* acc) {
  for (std::int64_t i = index0(); i < n; i += stride()) acc[i] += static_cast<double>(counts[i]);
}

}  // namespace

void weights_backward(const Tensor& probs, const Tensor& experts, const Tensor& kept,
                      const Tensor& dweights, bool renormalize, const Tensor& dprobs,
                      const Stream& stream) {
  const std::int64_t T = probs.size(0), E = probs.size(1);
  check(cudaMemsetAsync(dprobs.data_ptr(), 0, static_cast<std::size_t>(T * E) * sizeof(float),
                        stream.handle()),
        "memset");
  if (T == 0) return;
  weights_backward_kernel<<<grid_for(T), kThreads, 0, stream.handle()>>>(
      ptr<const float>(probs), ptr<const std::int32_t>(experts), ptr<const std::uint8_t>(kept),
      ptr<const float>(dweights), T, E, static_cast<int>(experts.size(1)), renormalize,
      ptr<float>(dprobs));
  check_launch("weights backward");
}

void scores_backward(const Tensor& probs, const Tensor& dprobs, bool softmax, const Tensor& dlogits,
                     const Stream& stream) {
  const std::int64_t T = probs.size(0), E = probs.size(1);
  if (T == 0) return;
  scores_backward_kernel<<<grid_for(T), kThreads, 0, stream.handle()>>>(
      ptr<const float>(probs), ptr<const float>(dprobs), T, E, softmax, ptr<float>(dlogits));
  check_launch("scores backward");
}

void aux_stats(const Tensor& probs, const Tensor& experts, const Tensor& counts,
               const Tensor& prob_sum, const Stream& stream) {
  const std::int64_t T = probs.size(0), E = probs.size(1), G = counts.size(0);
  if (G * E == 0) return;
  aux_stats_kernel<<<grid_for(G * E), kThreads, 0, stream.handle()>>>(
      ptr<const float>(probs), ptr<const std::int32_t>(experts), G, T / G, E,
      static_cast<int>(experts.size(1)), ptr<float>(counts), ptr<float>(prob_sum));
  check_launch("aux stats");
}

void aux_loss(const Tensor& counts, const Tensor& prob_sum, double group_tokens, int top_k,
              double coeff, const Tensor& acc, const Stream& stream) {
  aux_loss_kernel<<<1, 1, 0, stream.handle()>>>(
      ptr<const float>(counts), ptr<const float>(prob_sum), counts.size(0), counts.size(1),
      group_tokens, top_k, coeff, ptr<double>(acc));
  check_launch("aux loss");
}

void add_aux_loss_grad(const Tensor& counts, double factor, const Tensor& dprobs,
                       const Stream& stream) {
  const std::int64_t T = dprobs.size(0), E = dprobs.size(1);
  if (T * E == 0) return;
  aux_grad_kernel<<<grid_for(T * E), kThreads, 0, stream.handle()>>>(
      ptr<const float>(counts), T, counts.size(0), E, factor, ptr<float>(dprobs));
  check_launch("aux loss grad");
}

void add_counts(const Tensor& counts, const Tensor& acc, const Stream& stream) {
  const std::int64_t n = counts.numel();
  if (n == 0) return;
  add_counts_kernel<<<grid_for(n), kThreads, 0, stream.handle()>>>(ptr<const std::int64_t>(counts),
                                                                   n, ptr<double>(acc));
  check_launch("add counts");
}

void z_loss(const Tensor& logits, double coeff, const Tensor& acc, const Stream& stream) {
  const std::int64_t T = logits.size(0);
  if (T == 0) return;
  z_loss_kernel<<<1, kThreads, 0, stream.handle()>>>(ptr<const float>(logits), T, logits.size(1),
                                                     coeff, ptr<double>(acc));
  check_launch("z loss");
}

void add_z_loss_grad(const Tensor& logits, double factor, const Tensor& dlogits,
                     const Stream& stream) {
  const std::int64_t T = logits.size(0);
  if (T == 0) return;
  z_grad_kernel<<<grid_for(T), kThreads, 0, stream.handle()>>>(
      ptr<const float>(logits), T, logits.size(1), factor, ptr<float>(dlogits));
  check_launch("z loss grad");
}

}  // namespace quintet::expert::cuda
