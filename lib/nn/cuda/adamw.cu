// AdamW on the GPU as one fused element-wise kernel: reads the f32 master weight, gradient and
// both moments once, writes them back and, when asked, the converted compute-dtype parameter.
#include <cmath>

#include "nn/cuda/cuda_ops.hpp"
#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops {

using namespace detail;

namespace {

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
};

// P: the dtype of the parameter copy; param may be null (then nothing is written there).
template <class P>
__global__ void adamw_kernel(float* master, const float* grad, float* m, float* v, P* param,
                             AdamWArgs a, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += global_stride()) {
    const float g = grad[i] * a.grad_scale;
    float p = master[i];
    p -= a.lr * a.weight_decay * p;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= a.lr * (mi / a.bias_correction1) / (sqrtf(vi / a.bias_correction2) + a.eps);
    master[i] = p;
    if (param) param[i] = from_float<P>(p);
  }
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWHyper& hyper, std::int64_t step,
                float grad_scale, const Tensor& param, const Stream& stream) {
  const std::int64_t n = master.numel();
  if (n == 0) return;
  AdamWArgs a;
  a.lr = hyper.lr;
  a.beta1 = hyper.beta1;
  a.beta2 = hyper.beta2;
  a.eps = hyper.eps;
  a.weight_decay = hyper.weight_decay;
  a.grad_scale = grad_scale;
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(double(hyper.beta1), double(step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(double(hyper.beta2), double(step)));
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

}  // namespace quintet::nn::cuda_ops
