// RoPE on the GPU: one thread per rotated pair (i, i + D/2) of one (batch, token, head), reading
// and writing through the strides of x and y, so the q and k heads of a fused projection are
// rotated where they lie (in place, no copy). Consecutive threads take consecutive i, so a warp
// reads two contiguous runs of a head. inv_freq travels in the kernel's parameters (f32, as the
// CPU op rounds it); the angle and its cosine and sine are f32, like the CPU op's f32 path.
#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

constexpr int kMaxHalf = 256;  // head_dim <= 512

struct RopeArgs {
  std::int64_t n;                 // pairs: B * S * H * half
  std::int64_t seq, heads, half;  // S, H, D / 2
  std::int64_t xs[4], ys[4];      // strides of x and y (elements)
  std::int64_t pos_b, pos_s;      // strides of positions ([S]: pos_b = 0)
  std::int64_t offset;            // position_offset
  float sign;                     // +1 forward, -1 inverse
  float inv_freq[kMaxHalf];
};

template <class T, class P>
__global__ void rope_kernel(const T* x, T* y, const P* positions, RopeArgs a) {
  for (std::int64_t idx = global_index(); idx < a.n; idx += global_stride()) {
    const std::int64_t i = idx % a.half;
    std::int64_t r = idx / a.half;
    const std::int64_t h = r % a.heads;
    r /= a.heads;
    const std::int64_t s = r % a.seq, b = r / a.seq;
    const std::int64_t p =
        a.offset + (positions != nullptr
                        ? static_cast<std::int64_t>(positions[b * a.pos_b + s * a.pos_s])
                        : s);
    float sn, cs;
    sincosf(static_cast<float>(p) * a.inv_freq[i], &sn, &cs);
    sn *= a.sign;
    const T* xr = x + b * a.xs[0] + s * a.xs[1] + h * a.xs[2];
    T* yr = y + b * a.ys[0] + s * a.ys[1] + h * a.ys[2];
    const float lo = to_float(xr[i * a.xs[3]]), hi = to_float(xr[(i + a.half) * a.xs[3]]);
    yr[i * a.ys[3]] = from_float<T>(lo * cs - hi * sn);
    yr[(i + a.half) * a.ys[3]] = from_float<T>(hi * cs + lo * sn);
  }
}

}  // namespace

void rope(const Tensor& x, const Tensor& y, const Tensor& positions,
          const std::vector<double>& inv_freq, std::int64_t position_offset, bool inverse,
          const Stream& stream) {
  const std::int64_t half = x.size(3) / 2;
  QUINTET_CHECK(half <= kMaxHalf, "rope: head_dim = {}; the CUDA kernel takes head_dim up to {}",
                x.size(3), 2 * kMaxHalf);
  RopeArgs a{};
  a.n = x.size(0) * x.size(1) * x.size(2) * half;
  a.seq = x.size(1);
  a.heads = x.size(2);
  a.half = half;
  for (int d = 0; d < 4; ++d) {
    a.xs[d] = x.stride(d);
    a.ys[d] = y.stride(d);
  }
  if (positions.defined()) {
    a.pos_b = positions.dim() == 2 ? positions.stride(0) : 0;
    a.pos_s = positions.stride(positions.dim() - 1);
  }
  a.offset = position_offset;
  a.sign = inverse ? -1.0f : 1.0f;
  for (std::int64_t i = 0; i < half; ++i) a.inv_freq[i] = static_cast<float>(inv_freq[i]);
  if (a.n == 0) return;
  dispatch_compute(x.dtype(), "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (positions.defined() && positions.dtype() == DType::i32) {
      rope_kernel<T, std::int32_t><<<grid_for(a.n), kThreads, 0, stream.handle()>>>(
          ptr<T>(x), ptr<T>(y), ptr<std::int32_t>(positions), a);
    } else {
      rope_kernel<T, std::int64_t><<<grid_for(a.n), kThreads, 0, stream.handle()>>>(
          ptr<T>(x), ptr<T>(y), positions.defined() ? ptr<std::int64_t>(positions) : nullptr, a);
    }
  });
  check_launch();
}

}  // namespace quintet::nn::cuda_ops
