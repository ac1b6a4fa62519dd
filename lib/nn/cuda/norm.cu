// LayerNorm and RMSNorm over the last dimension on the GPU: one block per row for the forward and
// the input gradient (statistics in f32), and a column kernel that accumulates dgamma/dbeta in f32.
// Rows that are whole 16-byte vectors (and fit kRowVecs vectors a thread) take vectorized row
// kernels, shared by both norms, that keep the row in registers and, in the backward, sum dgamma
// (and dbeta) in registers too (one pass over dy and x); the others take the scalar kernels.
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

// The vectorized row kernels: one block per row (a grid-stride loop over rows), each thread
// holding up to kRowVecs 16-byte vectors of the row in registers (thread t has vectors t,
// t + blockDim.x, ...), so a row is read from memory once and its statistics stay in registers.
// kLayer picks LayerNorm (mean subtracted, beta and dbeta) over RMSNorm. The arithmetic per
// element is the scalar kernels', in the same order within an element.
constexpr int kRowVecs = 4;

// Calls f(k, c) for the thread's vectors c = threadIdx.x + k * blockDim.x (k < kRowVecs, c < nvec)
// of a row; k is a constant after unrolling, so the arrays f indexes by k stay in registers.
template <class F>
__device__ __forceinline__ void each_row_vec(int nvec, F&& f) {
#pragma unroll
  for (int k = 0; k < kRowVecs; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) f(k, c);
  }
}

// Loads the thread's vectors of row p into v.
template <class T>
__device__ __forceinline__ void load_row(const Vec16<T>* p, int nvec, Vec16<T> (&v)[kRowVecs]) {
  each_row_vec(nvec, [&](int k, int c) { v[k] = p[c]; });
}

// y = (x - mean) * rstd * gamma + beta (LayerNorm; beta may be null) or x * rstd * gamma
// (RMSNorm, mean and beta unused) with rstd = 1 / sqrt(mean((x - mean)²) + eps); with res (and
// sum) non-null the row normalised is x + res rounded to T, written into sum. nvec = d / V vectors
// per row.
template <class T, bool kLayer>
__global__ void norm_forward_vec_kernel(const Vec16<T>* x, const Vec16<T>* res, Vec16<T>* sum,
                                        const Vec16<T>* gamma, const Vec16<T>* beta, float eps,
                                        Vec16<T>* y, float* mean, float* rstd, std::int64_t rows,
                                        int nvec) {
  constexpr int V = Vec16<T>::kCount;
  __shared__ float scratch[32];
  const float d = static_cast<float>(nvec) * V;
  Vec16<T> gv[kRowVecs], bv[kRowVecs];
  load_row(gamma, nvec, gv);
  if (kLayer && beta) load_row(beta, nvec, bv);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Vec16<T> xv[kRowVecs], rv[kRowVecs];
    load_row(x + r * nvec, nvec, xv);
    if (res) load_row(res + r * nvec, nvec, rv);
    float s = 0.0f;
    each_row_vec(nvec, [&](int k, int c) {
      if (res) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          xv[k].v[e] = from_float<T>(__fadd_rn(to_float(xv[k].v[e]), to_float(rv[k].v[e])));
        }
        sum[r * nvec + c] = xv[k];
      }
      if (kLayer) {
#pragma unroll
        for (int e = 0; e < V; ++e) s += to_float(xv[k].v[e]);
      }
    });
    const float mu = kLayer ? block_sum(s, scratch) / d : 0.0f;
    float s2 = 0.0f;
    each_row_vec(nvec, [&](int k, int) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float v = kLayer ? to_float(xv[k].v[e]) - mu : to_float(xv[k].v[e]);
        s2 += v * v;
      }
    });
    const float rs = 1.0f / sqrtf(block_sum(s2, scratch) / d + eps);
    if (threadIdx.x == 0) {
      if (kLayer) mean[r] = mu;
      rstd[r] = rs;
    }
    each_row_vec(nvec, [&](int k, int c) {
      Vec16<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xf = kLayer ? to_float(xv[k].v[e]) - mu : to_float(xv[k].v[e]);
        float v = xf * rs * to_float(gv[k].v[e]);
        if (kLayer && beta) v += to_float(bv[k].v[e]);
        out.v[e] = from_float<T>(v);
      }
      y[r * nvec + c] = out;
    });
  }
}

// Adds the V floats of part into dst[0 .. V) (16-byte aligned): 16-byte atomics on sm_90.
template <int V>
__device__ __forceinline__ void atomic_add_vec(float* dst, const float (&part)[V]) {
#pragma unroll
  for (int e = 0; e < V; e += 4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(dst + e),
              make_float4(part[e], part[e + 1], part[e + 2], part[e + 3]));
#else
    for (int q = 0; q < 4; ++q) atomicAdd(dst + e + q, part[e + q]);
#endif
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, xhat = (x - mean) * rstd
// (LayerNorm) or dx = rstd * (g - xhat * mean(g * xhat)) with xhat = x * rstd (RMSNorm), plus dres
// (may be null) rounded as the separate in-place add would. With dgamma (or, for LayerNorm, dbeta)
// non-null, each thread sums dy * xhat (and dy) of its columns over the block's rows in registers
// and adds them into dgamma (dbeta) once at the end (the grid is sized to a few blocks per
// multiprocessor for that).
template <class T, bool kLayer>
__global__ void norm_backward_vec_kernel(const Vec16<T>* dy, const Vec16<T>* x,
                                         const Vec16<T>* gamma, const float* mean,
                                         const float* rstd, const Vec16<T>* dres, Vec16<T>* dx,
                                         float* dgamma, float* dbeta, std::int64_t rows, int nvec) {
  constexpr int V = Vec16<T>::kCount;
  __shared__ float scratch[32];
  const float d = static_cast<float>(nvec) * V;
  Vec16<T> gv[kRowVecs];
  load_row(gamma, nvec, gv);
  float dg[kRowVecs][V] = {}, db[kLayer ? kRowVecs : 1][V] = {};
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Vec16<T> dyv[kRowVecs], xv[kRowVecs], dv[kRowVecs];
    load_row(dy + r * nvec, nvec, dyv);
    load_row(x + r * nvec, nvec, xv);
    if (dres) load_row(dres + r * nvec, nvec, dv);
    const float mu = kLayer ? mean[r] : 0.0f, rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    each_row_vec(nvec, [&](int k, int) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float dyf = to_float(dyv[k].v[e]);
        const float xf = kLayer ? to_float(xv[k].v[e]) - mu : to_float(xv[k].v[e]);
        const float g = dyf * to_float(gv[k].v[e]);
        if (kLayer) sg += g;
        sgx += g * xf * rs;
        if (dgamma) dg[k][e] += dyf * xf * rs;
        if (kLayer && dbeta) db[kLayer ? k : 0][e] += dyf;
      }
    });
    const float mean_g = kLayer ? block_sum(sg, scratch) / d : 0.0f;
    const float mean_gx = block_sum(sgx, scratch) / d;
    each_row_vec(nvec, [&](int k, int c) {
      Vec16<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float g = to_float(dyv[k].v[e]) * to_float(gv[k].v[e]);
        const float xhat = (kLayer ? to_float(xv[k].v[e]) - mu : to_float(xv[k].v[e])) * rs;
        // __fmul_rn / __fadd_rn: no fused multiply-add across the two, as in the scalar kernel.
        const T v =
            from_float<T>(__fmul_rn(rs, kLayer ? g - mean_g - xhat * mean_gx : g - xhat * mean_gx));
        out.v[e] = dres ? from_float<T>(__fadd_rn(to_float(v), to_float(dv[k].v[e]))) : v;
      }
      dx[r * nvec + c] = out;
    });
  }
  if (dgamma) each_row_vec(nvec, [&](int k, int c) { atomic_add_vec<V>(dgamma + c * V, dg[k]); });
  if (kLayer && dbeta) {
    each_row_vec(nvec, [&](int k, int c) { atomic_add_vec<V>(dbeta + c * V, db[kLayer ? k : 0]); });
  }
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

// Threads per block of the vectorized kernels for rows of nvec vectors: enough for kRowVecs
// vectors each (a multiple of 32); 0 where the row does not fit (the scalar kernels then).
inline int vec_row_threads(std::int64_t nvec) {
  if (nvec > 1024 * kRowVecs) return 0;
  const std::int64_t t = (nvec + kRowVecs - 1) / kRowVecs;
  return static_cast<int>(std::max<std::int64_t>(32, (t + 31) / 32 * 32));
}

template <class T>
const Vec16<T>* cvec(const Tensor& t) {
  return reinterpret_cast<const Vec16<T>*>(ptr_or_null<T>(t));
}

template <class T>
Vec16<T>* vec(const Tensor& t) {
  return reinterpret_cast<Vec16<T>*>(ptr_or_null<T>(t));
}

// LayerNorm (mean defined) or RMSNorm forward: the vectorized kernel where the rows are whole
// vectors that fit, the scalar one otherwise.
template <class T>
void any_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd,
                      const Tensor& residual, const Tensor& sum, const Stream& stream) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  if (rows == 0) return;
  const std::int64_t nvec = d / Vec16<T>::kCount;
  const int threads = vec_row_threads(nvec);
  const auto kernel =
      mean.defined() ? &norm_forward_vec_kernel<T, true> : &norm_forward_vec_kernel<T, false>;
  if (threads == 0 || threads > max_block_threads(kernel) ||
      !vectorizable<T>(d, {x.data_ptr(), gamma.data_ptr(), y.data_ptr(),
                           beta.defined() ? beta.data_ptr() : nullptr,
                           residual.defined() ? residual.data_ptr() : nullptr,
                           sum.defined() ? sum.data_ptr() : nullptr})) {
    norm_forward<T>(x, gamma, beta, eps, y, mean, rstd, residual, sum, stream);
    return;
  }
  kernel<<<row_grid(rows), threads, 0, stream.handle()>>>(
      cvec<T>(x), cvec<T>(residual), vec<T>(sum), cvec<T>(gamma), cvec<T>(beta), eps, vec<T>(y),
      ptr_or_null<float>(mean), ptr<float>(rstd), rows, static_cast<int>(nvec));
  check_launch();
}

// LayerNorm (mean defined) or RMSNorm backward (dbeta undefined for RMSNorm), vectorized where
// the rows allow as in any_norm_forward.
template <class T>
void any_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                       const Tensor& dbeta, const Tensor& dresidual, const Stream& stream) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  if (rows == 0) return;
  const std::int64_t nvec = d / Vec16<T>::kCount;
  const int threads = vec_row_threads(nvec);
  float* dg = ptr_or_null<float>(dgamma);
  float* db = ptr_or_null<float>(dbeta);
  const auto kernel =
      mean.defined() ? &norm_backward_vec_kernel<T, true> : &norm_backward_vec_kernel<T, false>;
  if (threads == 0 || threads > max_block_threads(kernel) ||
      !vectorizable<T>(d, {dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), dx.data_ptr(),
                           dresidual.defined() ? dresidual.data_ptr() : nullptr, dg, db})) {
    norm_backward<T>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, dresidual, stream);
    return;
  }
  // With parameter gradients, each block adds its column sums into them once at its end: as many
  // blocks as fit on the device at once (one wave, each taking a share of the rows), not one block
  // per row.
  std::int64_t grid = row_grid(rows);
  if (dg || db) {
    int per_sm = 0;
    QUINTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    grid = std::min<std::int64_t>(
        grid, static_cast<std::int64_t>(multiprocessors(x.device())) * std::max(1, per_sm));
  }
  kernel<<<static_cast<unsigned>(grid), threads, 0, stream.handle()>>>(
      cvec<T>(dy), cvec<T>(x), cvec<T>(gamma), ptr_or_null<float>(mean), ptr<float>(rstd),
      cvec<T>(dresidual), vec<T>(dx), dg, db, rows, static_cast<int>(nvec));
  check_launch();
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                       const Tensor& y, const Tensor& mean, const Tensor& rstd,
                       const Tensor& residual, const Tensor& sum, const Stream& stream) {
  dispatch_compute(x.dtype(), "layernorm_forward", [&](auto tag) {
    any_norm_forward<typename decltype(tag)::type>(x, gamma, beta, eps, y, mean, rstd, residual,
                                                   sum, stream);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                        const Tensor& dbeta, const Tensor& dresidual, const Stream& stream) {
  dispatch_compute(x.dtype(), "layernorm_backward", [&](auto tag) {
    any_norm_backward<typename decltype(tag)::type>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta,
                                                    dresidual, stream);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                     const Tensor& rstd, const Tensor& residual, const Tensor& sum,
                     const Stream& stream) {
  dispatch_compute(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    any_norm_forward<typename decltype(tag)::type>(x, gamma, Tensor(), eps, y, Tensor(), rstd,
                                                   residual, sum, stream);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dgamma, const Tensor& dresidual,
                      const Stream& stream) {
  dispatch_compute(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    any_norm_backward<typename decltype(tag)::type>(dy, x, gamma, Tensor(), rstd, dx, dgamma,
                                                    Tensor(), dresidual, stream);
  });
}

}  // namespace quintet::nn::cuda_ops
