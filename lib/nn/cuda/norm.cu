// LayerNorm and RMSNorm over the last dimension on the GPU: one block per row for the forward and
// the input gradient (statistics in f32), and a column kernel that accumulates dgamma/dbeta in f32.
// The residual forms fuse the residual add into the row kernels: the forward normalises
// x + residual (rounded to T, as the add would) and writes that sum; the backward adds the
// residual's gradient into dx (rounded as an in-place add would), so they equal add-then-norm and
// norm-then-add bit for bit.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

inline unsigned row_grid(std::int64_t rows) {
  return static_cast<unsigned>(std::min<std::int64_t>(rows, 1 << 20));
}

// mean is null for RMSNorm (then rstd = 1 / sqrt(mean(x²) + eps), y = x * rstd * gamma). With
// res (and sum) non-null, the row normalised is x + res, written into sum.
template <class T>
__global__ void norm_forward_kernel(const T* x, const T* res, T* sum, const T* gamma, const T* beta,
                                    float eps, T* y, float* mean, float* rstd, std::int64_t rows,
                                    int d) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * d;
    const T* rr = res ? res + r * d : nullptr;
    auto in = [&](int c) {
      return rr ? to_float(from_float<T>(__fadd_rn(to_float(xr[c]), to_float(rr[c]))))
                : to_float(xr[c]);
    };
    if (sum) {
      for (int c = threadIdx.x; c < d; c += blockDim.x) sum[r * d + c] = from_float<T>(in(c));
    }
    float mu = 0.0f;
    if (mean) {
      float s = 0.0f;
      for (int c = threadIdx.x; c < d; c += blockDim.x) s += in(c);
      mu = block_sum(s, scratch) / d;
    }
    float s2 = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float v = in(c)-mu;
      s2 += v * v;
    }
    const float rs = 1.0f / sqrtf(block_sum(s2, scratch) / d + eps);
    if (threadIdx.x == 0) {
      if (mean) mean[r] = mu;
      rstd[r] = rs;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float v = (in(c)-mu) * rs * to_float(gamma[c]);
      if (beta) v += to_float(beta[c]);
      y[r * d + c] = from_float<T>(v);
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, xhat the normalised x;
// RMSNorm (mean null) drops the mean(g) term and uses xhat = x * rstd.
// dres (may be null) is added into dx.
template <class T>
__global__ void norm_backward_input_kernel(const T* dy, const T* x, const T* gamma,
                                           const float* mean, const float* rstd, const T* dres,
                                           T* dx, std::int64_t rows, int d) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float g = to_float(dy[r * d + c]) * to_float(gamma[c]);
      sg += g;
      sgx += g * (to_float(x[r * d + c]) - mu) * rs;
    }
    const float mean_g = mean ? block_sum(sg, scratch) / d : 0.0f;
    const float mean_gx = block_sum(sgx, scratch) / d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float g = to_float(dy[r * d + c]) * to_float(gamma[c]);
      const float xhat = (to_float(x[r * d + c]) - mu) * rs;
      // __fmul_rn / __fadd_rn: no fused multiply-add across the two, so the sum rounds as the
      // separate in-place add's does.
      const T v = from_float<T>(__fmul_rn(rs, g - mean_g - xhat * mean_gx));
      dx[r * d + c] = dres ? from_float<T>(__fadd_rn(to_float(v), to_float(dres[r * d + c]))) : v;
    }
  }
}

// dgamma[c] += sum_r dy * xhat; dbeta[c] += sum_r dy (either pointer may be null). Block: 256
// columns (x) by a chunk of rows (y), one atomic per column per chunk.
template <class T>
__global__ void norm_backward_params_kernel(const T* dy, const T* x, const float* mean,
                                            const float* rstd, float* dgamma, float* dbeta,
                                            std::int64_t rows, int d, std::int64_t chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk;
  const std::int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float sg = 0.0f, sb = 0.0f;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float g = to_float(dy[r * d + c]);
    sb += g;
    sg += g * (to_float(x[r * d + c]) - (mean ? mean[r] : 0.0f)) * rstd[r];
  }
  if (dgamma) atomicAdd(dgamma + c, sg);
  if (dbeta) atomicAdd(dbeta + c, sb);
}

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? ptr<T>(t) : nullptr;
}

template <class T>
void norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                  const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                  const Tensor& sum, const Stream& stream) {
  const std::int64_t rows = x.size(0);
  const int d = static_cast<int>(x.size(1));
  if (rows == 0) return;
  norm_forward_kernel<T><<<row_grid(rows), row_threads(d), 0, stream.handle()>>>(
      ptr<T>(x), ptr_or_null<T>(residual), ptr_or_null<T>(sum), ptr<T>(gamma), ptr_or_null<T>(beta),
      eps, ptr<T>(y), ptr_or_null<float>(mean), ptr<float>(rstd), rows, d);
  check_launch();
}

template <class T>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                   const Tensor& dresidual, const Stream& stream) {
  const std::int64_t rows = x.size(0);
  const int d = static_cast<int>(x.size(1));
  if (rows == 0) return;
  const float* mu = mean.defined() ? ptr<float>(mean) : nullptr;
  norm_backward_input_kernel<T><<<row_grid(rows), row_threads(d), 0, stream.handle()>>>(
      ptr<T>(dy), ptr<T>(x), ptr<T>(gamma), mu, ptr<float>(rstd), ptr_or_null<T>(dresidual),
      ptr<T>(dx), rows, d);
  check_launch();
  if (!dgamma.defined() && !dbeta.defined()) return;
  const std::int64_t chunk = std::max<std::int64_t>(64, (rows + 65534) / 65535);
  const dim3 grid(static_cast<unsigned>((d + kThreads - 1) / kThreads),
                  static_cast<unsigned>((rows + chunk - 1) / chunk));
  norm_backward_params_kernel<T><<<grid, kThreads, 0, stream.handle()>>>(
      ptr<T>(dy), ptr<T>(x), mu, ptr<float>(rstd), dgamma.defined() ? ptr<float>(dgamma) : nullptr,
      dbeta.defined() ? ptr<float>(dbeta) : nullptr, rows, d, chunk);
  check_launch();
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd,
                       const Tensor& residual, const Tensor& sum, const Stream& stream) {
  dispatch_compute(x.dtype(), "layernorm_forward", [&](auto tag) {
    norm_forward<typename decltype(tag)::type>(x, gamma, beta, eps, y, mean, rstd, residual, sum,
                                               stream);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta, const Tensor& dresidual, const Stream& stream) {
  dispatch_compute(x.dtype(), "layernorm_backward", [&](auto tag) {
    norm_backward<typename decltype(tag)::type>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta,
                                                dresidual, stream);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                     const Tensor& rstd, const Tensor& residual, const Tensor& sum,
                     const Stream& stream) {
  dispatch_compute(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    norm_forward<typename decltype(tag)::type>(x, gamma, Tensor(), eps, y, Tensor(), rstd, residual,
                                               sum, stream);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dgamma, const Tensor& dresidual,
                      const Stream& stream) {
  dispatch_compute(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    norm_backward<typename decltype(tag)::type>(dy, x, gamma, Tensor(), rstd, dx, dgamma, Tensor(),
                                                dresidual, stream);
  });
}

}  // namespace quintet::nn::cuda_ops
