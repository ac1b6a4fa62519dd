// nn::AdamW: one process's AdamW over the parameters of a ParameterStore, with f32 master
// weights, gradient clipping by this store's global norm and decoupled weight decay (skipped for
// parameters whose attributes say so). Test support, not library: the tests' single-rank
// reference optimizer (the library's is quintet::data_parallel::DistributedOptimizer, which takes
// the norm over the whole job, at dp 1 too). Source: nn_adamw.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "quintet/nn/optimizer.hpp"

namespace quintet::nn {

// Holds the optimizer state (master weights when the compute dtype is not f32, exp_avg,
// exp_avg_sq: f32, one flat buffer each, same layout as the store). The store must outlive it.
//
// One process's optimizer: its gradient norm is over this store alone. So it refuses, with an
// InvalidArgument that names quintet::data_parallel::DistributedOptimizer (which takes the norm
// over the whole job, at dp 1 too):
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

}  // namespace quintet::nn
