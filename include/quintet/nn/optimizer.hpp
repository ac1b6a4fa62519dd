// AdamW over the parameters of a ParameterStore, with f32 master weights, gradient clipping by
// the global norm and decoupled weight decay (skipped for parameters whose attributes say so).
#pragma once

#include <cstdint>
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

struct OptimizerStepInfo {
  double grad_norm = 0.0;   // global norm of the gradients before clipping
  float grad_scale = 1.0f;  // the factor the gradients were multiplied by (clipping)
  std::int64_t step = 0;    // the step just taken (1 for the first)
};

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

  // One update from the current gradients: global norm (synchronises stream to read it), clip,
  // fused AdamW per parameter, compute-dtype copy refreshed. Does not zero the gradients.
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
