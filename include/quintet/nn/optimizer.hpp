// What the optimizers share: AdamW's settings (AdamWConfig), the global gradient norm of a step
// (PendingNorm, OptimizerStepInfo) and the restore of an optimizer's state from a checkpoint. The
// library's optimizer is quintet::data_parallel::DistributedOptimizer
// (quintet/parallel/data_parallel/ distributed_optimizer.hpp), over every layout, dp 1 included.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "quintet/nn/ops.hpp"
#include "quintet/nn/parameter.hpp"

namespace quintet::nn {

struct AdamWConfig {
  AdamWHyper hyper;            // lr, betas, eps, weight_decay
  float max_grad_norm = 1.0f;  // clip when the global gradient norm exceeds it; <= 0: no clipping
};

// The global gradient norm of one step, left on the device until read: the sum of squares is
// copied into pinned host memory on the step's stream, behind an event. Private to the
// optimizers (made by them, read through OptimizerStepInfo).
class PendingNorm {
 public:
  // who: the optimizer, for messages ("DistributedOptimizer::step").
  PendingNorm(const Device& device, std::string who);
  // Queues the copy of sum_sq (a scalar f32 on the device) on stream; the norm is then unread.
  void record(const Tensor& sum_sq, const Stream& stream);
  // sqrt of the recorded sum of squares: waits for the copy. Throws InvalidArgument when it is inf
  // or nan (that step updated nothing).
  double norm();

 private:
  std::string who_;
  Tensor host_;  // [1] f32, pinned
  Event ready_;
};

struct OptimizerStepInfo {
  std::int64_t step = 0;  // the step just taken (1 for the first)

  // The global norm of the gradients before clipping (NaN where it is not this optimizer's to
  // take), and the factor the gradients were multiplied by (clip_scale). On a GPU the step leaves
  // the norm on the device, where the update takes its clip factor: the first read waits for the
  // step's norm (free once the stream is synchronised, as after reading the loss). Throws
  // InvalidArgument when the norm was inf or nan: that step updated nothing. (On the CPU the
  // step itself throws first.)
  double grad_norm() const;
  float grad_scale() const;

  // Made by the optimizers: a norm known on the host, or one left on the device. local_only:
  // the norm is this rank's part only (grad_norm() is NaN).
  static OptimizerStepInfo known(std::int64_t step, double norm, float max_grad_norm,
                                 bool local_only = false);
  static OptimizerStepInfo pending(std::int64_t step, std::shared_ptr<PendingNorm> norm,
                                   float max_grad_norm, bool local_only = false);

 private:
  void resolve() const;
  mutable std::shared_ptr<PendingNorm> pending_;
  mutable double norm_ = 0.0;
  float max_grad_norm_ = 0.0f;
  bool local_only_ = false;
};

// The optimizers' step on a norm left on the device: checks that the previous step's norm was
// finite (InvalidArgument naming it if not; waits for it) and returns the PendingNorm to record
// this step's into: *slot itself when nobody else holds it, else a new one.
std::shared_ptr<PendingNorm> next_pending_norm(std::shared_ptr<PendingNorm>* slot,
                                               const Device& device, const std::string& who);

// Restores an optimizer's state from named tensors (what its state() returned): state must hold
// exactly the names of expected, each with its shape and dtype, and "step" (i64 [1]) >= 0 — else
// InvalidArgument naming `who` and the tensor, before anything changes. Then *step takes "step"
// and every other tensor is copied, on stream, into the tensor of that name in expected (views of
// the optimizer's buffers). Used by the data-parallel DistributedOptimizer (and the tests' AdamW).
void load_optimizer_state(const char* who, const std::vector<std::pair<std::string, Tensor>>& state,
                          const std::vector<std::pair<std::string, Tensor>>& expected,
                          std::int64_t* step, const Stream& stream);

}  // namespace quintet::nn
