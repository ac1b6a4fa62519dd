// AdamW on the GPU as one fused element-wise kernel: reads the f32 master weight, gradient and
// both moments once, writes them back and, when asked, the converted compute-dtype parameter.
// adamw_step_many runs it over many tensors per launch (multi_tensor.cuh), with the clip factor
// computed on the device from the global sum of squares, so the step needs no host sync.
#include <cmath>
#include <type_traits>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"
#include "nn/cuda/multi_tensor.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
};

// The update of one element in registers: master weight p, moments m and v, gradient g (the
// clip and loss scales applied); weight_decay is the element's own.
__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float g,
                                             const AdamWArgs& a, float weight_decay) {
  p -= a.lr * weight_decay * p;
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  p -= a.lr * (m / a.bias_correction1) / (sqrtf(v / a.bias_correction2) + a.eps);
}

// The update of element i; weight_decay and grad_scale are the element's own.
template <class P>
__device__ __forceinline__ void adamw_element(float* master, const float* grad, float* m, float* v,
                                              P* param, const AdamWArgs& a, float weight_decay,
                                              float grad_scale, std::int64_t i) {
  float p = master[i], mi = m[i], vi = v[i];
  adamw_update(p, mi, vi, grad[i] * grad_scale, a, weight_decay);
  m[i] = mi;
  v[i] = vi;
  master[i] = p;
  if (param) param[i] = from_float<P>(p);
}

// Four parameter values, stored at once.
template <class P>
struct alignas(4 * sizeof(P)) Param4 {
  P v[4];
};

// The update of elements 4 j to 4 j + 3 as adamw_element's, through 16-byte loads and stores (the
// entry's pointers aligned, its size a multiple of 4: adamw_step_many's grouping).
template <class P>
__device__ __forceinline__ void adamw_group4(float* master, const float* grad, float* m, float* v,
                                             P* param, const AdamWArgs& a, float weight_decay,
                                             float grad_scale, std::int64_t j) {
  float4 p = reinterpret_cast<float4*>(master)[j], mi = reinterpret_cast<float4*>(m)[j],
         vi = reinterpret_cast<float4*>(v)[j];
  const float4 g = reinterpret_cast<const float4*>(grad)[j];
  adamw_update(p.x, mi.x, vi.x, g.x * grad_scale, a, weight_decay);
  adamw_update(p.y, mi.y, vi.y, g.y * grad_scale, a, weight_decay);
  adamw_update(p.z, mi.z, vi.z, g.z * grad_scale, a, weight_decay);
  adamw_update(p.w, mi.w, vi.w, g.w * grad_scale, a, weight_decay);
  reinterpret_cast<float4*>(m)[j] = mi;
  reinterpret_cast<float4*>(v)[j] = vi;
  reinterpret_cast<float4*>(master)[j] = p;
  if (param) {
    reinterpret_cast<Param4<P>*>(param)[j] =
        Param4<P>{{from_float<P>(p.x), from_float<P>(p.y), from_float<P>(p.z), from_float<P>(p.w)}};
  }
}

// P: the dtype of the parameter copy; param may be null (then nothing is written there).
template <class P>
__global__ void adamw_kernel(float* master, const float* grad, float* m, float* v, P* param,
                             AdamWArgs a, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    adamw_element(master, grad, m, v, param, a, a.weight_decay, a.grad_scale, i);
  }
}

struct AdamWEntry {
  float* master;
  const float* grad;
  float* m;
  float* v;
  void* param;  // P*, or null
  float weight_decay;
};

// The clip factor from the global sum of squares (clip_scale in ops.hpp), or a negative value
// when the norm is inf or nan: then nothing is updated.
__device__ __forceinline__ float device_clip_scale(const float* sum_sq, float max_grad_norm) {
  const float sq = *sum_sq;
  if (!isfinite(sq)) return -1.0f;
  const float norm = sqrtf(sq);
  return max_grad_norm > 0.0f && norm > max_grad_norm ? max_grad_norm / (norm + 1e-6f) : 1.0f;
}

// kGroup4: the list counts groups of 4 elements (adamw_group4), else elements.
template <class P, bool kGroup4>
__global__ void adamw_many_kernel(TensorList<AdamWEntry> list, std::int64_t total, AdamWArgs a,
                                  const float* sum_sq, float max_grad_norm) {
  const float scale = device_clip_scale(sum_sq, max_grad_norm);
  if (scale < 0.0f) return;
  for_each_element(list, total, [&](int t, std::int64_t i) {
    const AdamWEntry& e = list.entry[t];
    if constexpr (kGroup4) {
      adamw_group4(e.master, e.grad, e.m, e.v, static_cast<P*>(e.param), a, e.weight_decay, scale,
                   i);
    } else {
      adamw_element(e.master, e.grad, e.m, e.v, static_cast<P*>(e.param), a, e.weight_decay, scale,
                    i);
    }
  });
}

AdamWArgs adamw_args(const AdamWHyper& hyper, std::int64_t step, float grad_scale) {
  AdamWArgs a;
  a.lr = hyper.lr;
  a.beta1 = hyper.beta1;
  a.beta2 = hyper.beta2;
  a.eps = hyper.eps;
  a.weight_decay = hyper.weight_decay;
  a.grad_scale = grad_scale;
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(double(hyper.beta1), double(step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(double(hyper.beta2), double(step)));
  return a;
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param, const Stream& stream) {
  const std::int64_t n = master.numel();
  if (n == 0) return;
  const AdamWArgs a = adamw_args(hyper, step, grad_scale);
  auto launch = [&](auto* p) {
    using P = std::remove_pointer_t<decltype(p)>;
    adamw_kernel<P><<<grid_for(n), kThreads, 0, stream.handle()>>>(
        ptr<float>(master), ptr<float>(grad), ptr<float>(exp_avg), ptr<float>(exp_avg_sq), p, a, n);
  };
  if (param.defined()) {
    dispatch_float(param.dtype(), "adamw_step", [&](auto tag) {
      using P = typename decltype(tag)::type;
      launch(ptr<P>(param));
    });
  } else {
    launch(static_cast<float*>(nullptr));
  }
  check_launch();
}

void adamw_step_many(const std::vector<AdamWTensors>& tensors, const AdamWHyper& hyper,
                     std::int64_t step, const Tensor& sum_sq, float max_grad_norm,
                     const Stream& stream) {
  const AdamWArgs a = adamw_args(hyper, step, 1.0f);
  std::vector<AdamWEntry> entries;
  std::vector<std::int64_t> numel;
  DType param_dtype = DType::f32;
  for (const AdamWTensors& t : tensors) {
    if (t.param.defined()) param_dtype = t.param.dtype();  // one dtype (checked by the caller)
    entries.push_back({ptr<float>(t.master), ptr<float>(t.grad), ptr<float>(t.exp_avg),
                       ptr<float>(t.exp_avg_sq), t.param.defined() ? t.param.data_ptr() : nullptr,
                       t.weight_decay ? hyper.weight_decay : 0.0f});
    numel.push_back(t.master.numel());
  }
  dispatch_float(param_dtype, "adamw_step_many", [&](auto tag) {
    using P = typename decltype(tag)::type;
    auto launch = [&](auto group4) {
      return [&](const TensorList<AdamWEntry>& list, std::int64_t n) {
        adamw_many_kernel<P, decltype(group4)::value>
            <<<chunk_blocks(n), kThreads, 0, stream.handle()>>>(list, n, a, ptr<float>(sum_sq),
                                                                max_grad_norm);
        check_launch();
      };
    };
    // Tensors of a multiple of 4 elements with aligned buffers (nearly all of a model's, laid out
    // in the flat buffers) move 16-byte vectors; the rest element by element.
    const auto fits = [](const AdamWEntry& e) {
      return aligned_to(e.master, 16) && aligned_to(e.grad, 16) && aligned_to(e.m, 16) &&
             aligned_to(e.v, 16) && aligned_to(e.param, 4 * sizeof(P));
    };
    for_each_tensor_list_grouped(entries, numel, 4, fits, launch(std::true_type{}),
                                 launch(std::false_type{}));
  });
}

}  // namespace quintet::nn::cuda_ops
