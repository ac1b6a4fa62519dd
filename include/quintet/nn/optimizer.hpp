// AdamW over the parameters of a ParameterStore, with f32 master weights, gradient clipping by
// the global norm and decoupled weight decay (skipped for parameters whose attributes say so).
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

// Holds the optimizer state (master weights when the compute dtype is not f32, exp_avg,
// exp_avg_sq: f32, one flat buffer each, same layout as the store). The store must outlive it.
//
// One process's optimizer: its gradient norm is over this store alone. So it refuses, with an
// InvalidArgument that names quintet::DistributedOptimizer (which takes the norm over the whole
// job, at dp 1 too):
//   - at construction, clipping (max_grad_norm > 0) when a parameter's gradient norm lives on
//     several ranks: a tensor-parallel shard (full_shape larger than its shape), a partial sum
//     over tp (reduce_over_tp), an expert's weight, a weight tied across chunks. Without clipping
//     each update is elementwise and runs, but step()'s grad_norm is NaN (not the model's norm);
//   - at every step, a store under a DataParallel (ParameterStore::data_parallel: its gradients
//     are reduced, and under ZeRO sharded, by DataParallel).
class AdamW {
 public:
  AdamW(ParameterStore& store, const AdamWConfig& config, const Stream& stream);

  // One update from the current gradients: global norm, clip, fused AdamW over every parameter
  // (adamw_step_many: on a GPU no host synchronisation; the norm is read when asked for, see
  // OptimizerStepInfo), compute-dtype copy refreshed. Does not zero the gradients.
  OptimizerStepInfo step(const Stream& stream);
  // Changes the learning rate (schedules).
  void set_lr(float lr) { config_.hyper.lr = lr; }
  const AdamWConfig& config() const { return config_; }
  std::int64_t steps() const { return step_; }

  // The optimizer state as named tensors, for checkpoints: "step" (i64 [1], a copy), "master"
  // (only when the compute dtype is not the state dtype: f32/f64 values are their own master),
  // "exp_avg", "exp_avg_sq" (views of the flat buffers, store layout).
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores what state() returned: the same names, shapes and dtypes (copied in on stream).
  // Throws InvalidArgument naming the tensor on a mismatch, before changing anything. Parameter
  // values are not touched; restore them from the same checkpoint.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, const Stream& stream);

 private:
  ParameterStore& store_;
  AdamWConfig config_;
  std::int64_t step_ = 0;
  bool separate_master_;
  bool local_norm_only_ = false;  // a parameter's norm is spread over ranks: grad_norm is NaN
  Tensor master_, exp_avg_, exp_avg_sq_;  // flat, store layout
  std::shared_ptr<PendingNorm> pending_;  // GPU: the last step's norm
};

// Restores an optimizer's state from named tensors (what its state() returned): state must hold
// exactly the names of expected, each with its shape and dtype, and "step" (i64 [1]) >= 0 — else
// InvalidArgument naming `who` and the tensor, before anything changes. Then *step takes "step"
// and every other tensor is copied, on stream, into the tensor of that name in expected (views of
// the optimizer's buffers). Shared by AdamW and the data-parallel DistributedOptimizer.
void load_optimizer_state(const char* who, const std::vector<std::pair<std::string, Tensor>>& state,
                          const std::vector<std::pair<std::string, Tensor>>& expected,
                          std::int64_t* step, const Stream& stream);

}  // namespace quintet::nn
