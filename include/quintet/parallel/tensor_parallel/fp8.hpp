// FP8 linear layers across ranks (parallel/tensor_parallel/fp8.cpp): the emulation of one layer's
// FP8 GEMMs and the end of a step's scaling.
//
// A tp linear layer built with fp8.mode = hybrid (linear.hpp) keeps the scaling state of its x, w
// (E4M3) and dy (E5M2) as nn::Fp8TensorScale entries of its module ("fp8_x", "fp8_w", "fp8_dy";
// nn::Module::named_fp8_scales). Its GEMMs multiply, in f32, the values the tensors take through
// FP8: forward y = q(x) · q(W)ᵀ, backward dx = q(dy) · q(W), dW += q(dy)ᵀ · q(x), with q() the
// round trip through the role's format at its scale (nn::fp8_round_trip); the bias gradient is
// the sum of q(dy), what the GEMMs see. Every amax is the whole tensor's, as one rank holding the
// unsharded layer computes it:
//   - current scaling: the amaxes of x and w (forward) and of dy (backward) are reduced (max)
//     over tp in one all-reduce per call, so a weight split over tp, an input split along its
//     features or a sequence-parallel chunk gets the scale of the whole tensor;
//   - delayed scaling: no communication in the step (but in the first, whose tensors have no
//     history yet and are scaled as current scaling does); fp8_end_step below reduces each
//     tensor's step amax (the max over the step's microbatches) over the given groups before
//     it enters the history.
// On a GPU the same scaling runs on the device with nothing waiting for it: each amax comes from
// a kernel (nn::fp8_amaxes_into: x's and w's in one launch) into a device tensor, is all-reduced
// there, and the scales are computed by nn::Fp8TensorScale::scales_on_device (one launch);
// fp8_end_step reads the step's amaxes back once per step (the one host wait), refuses a non-finite
// one naming its tensor, and ends the step on the host. The tp linear layers then run their GEMMs
// in FP8 (nn::fp8_gemm, linear.cpp); with overlap chunks they multiply the round-tripped values in
// bf16 as the CPU emulation does. Scales follow amaxes exactly, so the gradient's division among
// microbatches and data-parallel replicas (a power of 2 apart from one rank's) changes no rounding.
// Each microbatch's tensors are scaled on their own (current scaling), so data parallelism
// matches one rank running the same microbatches one after the other; context parallelism
// splits a microbatch's sequence, which these amaxes do not see whole (the trainer refuses
// --fp8 with cp > 1).
#pragma once

#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/fp8.hpp"

namespace quintet::tensor_parallel {

// The FP8 emulation of one linear layer (a tp one, or any other split over `tp`): its inputs
// rounded through FP8 at the scales of their amaxes, reduced over tp under current scaling.
class Fp8Linear {
 public:
  Fp8Linear() = default;  // off: every call returns its input
  Fp8Linear(nn::Fp8TensorScale& x, nn::Fp8TensorScale& w, nn::Fp8TensorScale& dy)
      : x_(&x), w_(&w), dy_(&dy) {}
  bool on() const { return x_ != nullptr; }

  struct Inputs {
    Tensor x, w;
  };
  // Forward: x and w as the FP8 GEMM sees them; remembers w's scale for backward (the weight
  // does not change within a step). record: the amaxes count for the step (not in an
  // evaluation or a recomputation: nn::Context::counts_statistics).
  Inputs forward(const Tensor& x, const Tensor& w, Communicator& tp, bool record,
                 const Stream& stream);
  // Backward: w at the forward's scale.
  Tensor weight(const Tensor& w, const Stream& stream) const;
  // Backward: dy as the FP8 GEMMs see it.
  Tensor output_grad(const Tensor& dy, Communicator& tp, const Stream& stream);

  // ---- on a GPU: the scales as device tensors (nn::fp8_scale_tensor's form), no host wait ----
  // Whether the layer's GEMMs run in FP8 on the device for a tensor on x's device.
  bool on_device(const Tensor& x) const { return on() && x.device().is_cuda(); }
  // A tensor's scale tensor for this call and, where its amax is still to be recorded, the
  // device slot the tensor's cast must max its amax into (nn::fp8_cast's amax; undefined: none).
  // Under delayed scaling with a history the scales are known before the tensors are read, so no
  // amax pass runs first: the casts record the amaxes in their own pass.
  struct Scale {
    Tensor scale, amax;
  };
  struct Scales {
    Scale x, w;
  };
  // Forward: the scales of x and w, their amaxes reduced (max) over tp as forward() does.
  Scales forward_scales(const Tensor& x, const Tensor& w, Communicator& tp, bool record,
                        const Stream& stream);
  // Backward: the scale of dy, its amax reduced over tp as output_grad() does.
  Scale output_grad_scale(const Tensor& dy, Communicator& tp, const Stream& stream);

  // ---- two layers reading one x (attention's key/value and query, SwiGLU's gate and up) ----
  // Whether a's and b's scales of x are one value in this call, so that one cast of x serves
  // both: both come from x's amax (current scaling, or delayed scaling before a history), or
  // both are delayed scales of the same value (equal histories: the same x every step).
  static bool same_x_scale(const Fp8Linear& a, const Fp8Linear& b);
  // forward_scales of a (with x and wa) and of b (with x and wb) at once, for one cast of x at
  // a's scale (same_x_scale): one amax launch over x, wa and wb and one scale launch, or none
  // under delayed scaling with a history. b's x state records what its own forward_scales would:
  // through the scale launch, or, where the cast records x's amax into x.amax (a's slot),
  // x_also is b's slot, which the caller max's with a's once the cast is done.
  struct SharedScales {
    Scale x, wa, wb;
    Tensor x_also;
  };
  static SharedScales shared_forward_scales(Fp8Linear& a, Fp8Linear& b, const Tensor& x,
                                            const Tensor& wa, const Tensor& wb, Communicator& tp,
                                            bool record, const Stream& stream);

 private:
  nn::Fp8TensorScale* x_ = nullptr;
  nn::Fp8TensorScale* w_ = nullptr;
  nn::Fp8TensorScale* dy_ = nullptr;
  float w_scale_ = 1.0f;
  Tensor w_scale_device_;  // on a GPU: the forward's scale of w
};

// Ends the step of every scale: their step amaxes reduced (max) over each communicator of
// `groups` (one all-reduce of all of them per group, skipped for one rank and for current
// scaling, which needs none), then Fp8TensorScale::end_step. Every rank of a group must pass the
// same scales in the same order. Call it after the step's last backward, on every rank.
void fp8_end_step(const std::vector<nn::Fp8TensorScale*>& scales,
                  const std::vector<Communicator*>& groups, const Stream& stream);

}  // namespace quintet::tensor_parallel
