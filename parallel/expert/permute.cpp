// The MoE permutation and combine (quintet/parallel/expert/permute.hpp): loops on the CPU, kernels
// on a GPU.
#include "quintet/parallel/expert/permute.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "quintet/core/config.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"

#if QUINTET_HAS_CUDA
#include "parallel/expert/cuda/moe_kernels.hpp"
#endif

namespace quintet::expert {

namespace {

template <class F>
void dispatch_cpu_real(DType dtype, F&& f) {
  if (dtype == DType::f64) {
    f(double{});
  } else {
    QUINTET_CHECK(dtype == DType::f32, "MoELayer: the CPU path computes in f32 or f64, not {}",
                  dtype_name(dtype));
    f(float{});
  }
}

void check_assignments(const Tensor& experts, const Tensor& kept) {
  QUINTET_CHECK(experts.dim() == 2 && experts.dtype() == DType::i32 && experts.is_contiguous() &&
                    kept.shape() == experts.shape() && kept.dtype() == DType::u8 &&
                    kept.is_contiguous() && kept.device() == experts.device(),
                "MoE permutation: expected contiguous experts [n, k] i32 and kept [n, k] u8 on one "
                "device, got {} and {}",
                experts.str(), kept.str());
}

}  // namespace

Permutation permute(const Tensor& experts, const Tensor& kept, std::int64_t num_experts,
                    const Stream& stream) {
  check_assignments(experts, kept);
  const std::int64_t A = experts.numel();
  const Device dev = experts.device();
  Permutation p;
  p.counts = Tensor::empty({num_experts}, DType::i64, dev, stream);
  p.rows_of = Tensor::empty({A}, DType::i32, dev, stream);
  p.slot = Tensor::empty(experts.shape(), DType::i32, dev, stream);
  if (dev.is_cuda()) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dev);
    cuda::permute(experts, kept, num_experts, p.counts, p.rows_of, p.slot, stream);
    return p;
#endif
  }
  const std::int64_t k = experts.size(1);
  const std::int32_t* ex = experts.data<std::int32_t>();
  const std::uint8_t* kp = kept.data<std::uint8_t>();
  std::int64_t* counts = p.counts.data<std::int64_t>();
  std::fill(counts, counts + num_experts, 0);
  for (std::int64_t a = 0; a < A; ++a) {
    if (kp[a] != 0) ++counts[ex[a]];
  }
  std::vector<std::int64_t> start(static_cast<std::size_t>(num_experts), 0);
  std::partial_sum(counts, counts + num_experts - 1, start.begin() + 1);
  std::int32_t* rows_of = p.rows_of.data<std::int32_t>();
  std::int32_t* slot = p.slot.data<std::int32_t>();
  std::fill(rows_of, rows_of + A, -1);
  for (std::int64_t a = 0; a < A; ++a) {
    slot[a] = -1;
    if (kp[a] == 0) continue;
    const std::int64_t row = start[ex[a]]++;
    slot[a] = static_cast<std::int32_t>(row);
    rows_of[row] = static_cast<std::int32_t>(a / k);
  }
  return p;
}

Tensor combine_rows(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                    const Stream& stream) {
  const std::int64_t n = slot.size(0), k = slot.size(1), d = rows.size(1);
  Tensor out = Tensor::empty({n, d}, rows.dtype(), rows.device(), stream);
  if (rows.device().is_cuda()) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(rows.device());
    cuda::combine(rows, slot, weights, out, stream);
    return out;
#endif
  }
  dispatch_cpu_real(rows.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* y = rows.data<T>();
    const std::int32_t* sl = slot.data<std::int32_t>();
    const float* w = weights.defined() ? weights.data<float>() : nullptr;
    T* o = out.data<T>();
    std::fill(o, o + n * d, T(0));
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        if (sl[a] < 0) continue;
        const T wt = w != nullptr ? static_cast<T>(w[a]) : T(1);
        const T* src = y + static_cast<std::int64_t>(sl[a]) * d;
        for (std::int64_t c = 0; c < d; ++c) o[t * d + c] += wt * src[c];
      }
    }
  });
  return out;
}

CombineGrads combine_rows_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                                   const Tensor& weights, const Stream& stream) {
  const std::int64_t n = dy.size(0), d = dy.size(1), k = slot.size(1);
  CombineGrads g;
  g.drows = Tensor::empty(rows.shape(), dy.dtype(), dy.device(), stream);
  g.dweights = Tensor::empty({n, k}, DType::f32, dy.device(), stream);
  if (dy.device().is_cuda()) {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(dy.device());
    cuda::combine_backward(dy, rows, slot, weights, g.drows, g.dweights, stream);
    return g;
#endif
  }
  dispatch_cpu_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* gy = dy.data<T>();
    const T* y = rows.data<T>();
    const std::int32_t* sl = slot.data<std::int32_t>();
    const float* w = weights.data<float>();
    T* dr = g.drows.data<T>();
    float* dw = g.dweights.data<float>();
    std::fill(dr, dr + rows.numel(), T(0));
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t a = t * k + j;
        dw[a] = 0.0f;
        if (sl[a] < 0) continue;
        const std::int64_t r = sl[a];
        const T wt = static_cast<T>(w[a]);
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c) {
          dr[r * d + c] = wt * gy[t * d + c];
          dot += static_cast<double>(gy[t * d + c]) * y[r * d + c];
        }
        dw[a] = static_cast<float>(dot);
      }
    }
  });
  return g;
}

}  // namespace quintet::expert
