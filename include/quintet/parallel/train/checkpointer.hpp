// Checkpointer: a training run saved and restored in one call each
// (parallel/train/checkpointer.cpp): the parameter values and optimizer state of every stage of a
// TrainingModel, the data loader's position, and the step, on top of the sharded checkpoint format
// (checkpoint/checkpoint.hpp).
//
//   quintet::train::Checkpointer checkpoints("runs/a", world.comm());
//   std::int64_t step = checkpoints.restore(model, loader).value_or(0);  // a fresh start: 0
//   for (; step < steps; ++step) {
//     model.step(loader);
//     if ((step + 1) % 100 == 0) checkpoints.save(step + 1, model, loader);
//   }
//
// The checkpoint loads at any layout (tp, cp, pp, vpp, dp, ep, etp, ZeRO stage, micro-batch): what
// is saved are pieces of global tensors (checkpoint/global_index.hpp). For every parameter, its
// value ("value", the compute dtype) and its optimizer state ("master", "exp_avg", "exp_avg_sq",
// f32, every element whatever the ZeRO stage: DistributedOptimizer::full_state) are saved as the
// box the rank holds of the global tensor (ParameterAttributes::full_shape and shard_start), by
// one rank of the group that holds the same box (dp and cp replicas; tp replicas of an unsplit
// tensor, or of a shard held by several tp ranks (ParameterAttributes::tp_replicas: key/value
// heads replicated over tp); edp replicas of an expert weight); the second copy of a tied weight
// is not saved. MoE
// balancing biases are saved as "<block>.mlp.balance_bias", FP8 delayed scaling's amax histories
// and scales (nn::Fp8TensorScale) under the fields "fp8_amax_history" and "fp8_scale" by the
// scale's name ("block0.attn.qkv.fp8_x"; restored when the checkpoint has them, a history of
// another length refused). Rank 0 writes the step, the optimizer
// step, the loader position (the global sample index: the same stream at any dp), the layout it
// ran at (for the record), and the run's identity: the model config, the global batch, the init
// seed and the loader's sampling. A restore refuses, naming the field, a checkpoint whose
// identity differs from the run's, before any tensor is read; then every rank reads the pieces
// its own boxes intersect (each verified by its checksum) and takes its ZeRO share of the state.
// An error on any rank (a missing piece, a corrupt shard) is an error on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace quintet::train {

// The model a checkpoint holds: a Checkpointer records its structure and sizes (GptConfig's, not
// its layout settings) in the metadata as "trainer_model", so that a tool without a job
// (12_checkpoint_tool --to-hf) can rebuild the config. Local. Throws InvalidArgument for a
// checkpoint not saved by a Checkpointer (the keys "trainer_identity" and "trainer_step" of its
// metadata), or saved before the model was recorded.
model::GptConfig checkpoint_model(const checkpoint::CheckpointInfo& checkpoint);
// The record of model that a save writes there (a JSON object), for programs that write
// checkpoints of their own.
std::string checkpoint_model_json(const model::GptConfig& model);

// This rank's pieces (global_index.hpp) of the master weights, field "master" (f32), as a save
// writes them: the box of each parameter this rank saves (one rank of each group holding the same
// box), views of the optimizer's full state (ZeRO: gathered, a collective over each stage's
// data-parallel groups). What a Hugging Face export of a running model writes first
// (hf_export.hpp).
std::vector<checkpoint::NamedTensor> master_weight_pieces(TrainingModel& model);

class Checkpointer {
 public:
  // dir holds the checkpoints (checkpoint.hpp's layout); world is the whole job (every rank takes
  // part in every save and restore). extra_identity: "key=value" pairs joined by ';' that the
  // trainer adds to the run's identity (its dataset, say), checked like the rest.
  Checkpointer(std::string dir, Communicator& world, std::string extra_identity = "");
  // Waits for an asynchronous save in progress (its error, if any, is dropped: call wait() to
  // see it).
  ~Checkpointer();
  Checkpointer(Checkpointer&&) = default;

  // Saves the run after `step` steps. Collective over world. user_json (a JSON value) is stored
  // with it and comes back from restore (a trainer's own settings). before_commit: see
  // save_checkpoint. Waits for ZeRO's pending parameter all-gathers first.
  void save(std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
            const std::string& user_json = "{}", const std::function<void()>& before_commit = {});

  // save(), with the writing in the background: the tensors are copied (GPU: to pinned host
  // buffers, on the model's stream, so the GPU copies before it goes on; CPU: to host buffers)
  // and a thread of this Checkpointer writes and commits them while training goes on, over its
  // own communicator (split from world on the first call: world must then be a CPU communicator,
  // e.g. World::cpu_comm()). The files are byte-identical to save()'s. The next save (either
  // kind) or restore waits for this one first. A failure is an error on every rank, thrown by
  // the first check() after it (on every rank at the same step), or by wait(), the next save or
  // restore (never lost). Collective over world.
  void save_async(std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
                  const std::string& user_json = "{}",
                  const std::function<void()>& before_commit = {});
  // Allocates the host buffers save_async copies into (GPU: pinned, about the checkpoint's size),
  // so that the first asynchronous save does not pay for them (seconds for gigabytes of pinned
  // memory): call it once before training when saves will be asynchronous. Collective over world
  // (it reads the optimizer's state as a save does: with ZeRO, a gather); copies nothing.
  void prepare_async(TrainingModel& model, const data::DataLoader& loader);
  // While an asynchronous save is pending: when it has ended on every rank, takes its result
  // (rethrowing its error, on every rank at the same call); else returns. Collective over world
  // then (one small all-reduce), so call it at the same point on every rank (a trainer: once a
  // step). Nothing, and no communication, when no save is pending.
  void check();
  // Waits for the asynchronous save in progress, if any; rethrows its error.
  void wait();
  bool saving() const { return pending_.valid(); }
  // After each save is committed (an asynchronous one: by its thread), keep only the newest n
  // checkpoints of dir (and the one `latest` names), removing older ones (prune_checkpoints, on
  // rank 0). 0 (the default) keeps every checkpoint; n < 0 is InvalidArgument.
  void set_keep_last(int n);
  int keep_last() const { return keep_last_; }

  // Restores the latest checkpoint of dir into model and loader (which seeks to the saved
  // position) and returns its step; nothing, touching nothing, when dir holds none. Collective
  // over world, at any layout. Throws InvalidArgument when the checkpoint was saved by a run of
  // another identity (naming the field and both values) or lacks a piece this layout needs
  // (naming the tensor), System for a corrupt or truncated shard (naming the file and the
  // checksums).
  std::optional<std::int64_t> restore(TrainingModel& model, data::DataLoader& loader);

  // The user_json of the checkpoint restore() read last (empty before one).
  const std::string& restored_user_json() const { return user_json_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string identity(const TrainingModel& model, const data::DataLoader& loader) const;
  // host_buffers_ shaped as tensors (kept where they already fit).
  void fit_host_buffers(const std::vector<checkpoint::NamedTensor>& tensors);
  // What a save writes: this rank's pieces (views of the model's tensors) and rank 0's metadata.
  std::pair<std::vector<checkpoint::NamedTensor>, std::string> snapshot(
      std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
      const std::string& user_json);

  std::string dir_;
  Communicator& world_;
  std::string extra_identity_;
  std::string user_json_;
  std::unique_ptr<Communicator> async_comm_;  // the background thread's (split on first use)
  std::future<void> pending_;                 // the asynchronous save in progress
  std::vector<Tensor> host_buffers_;          // its copies, reused by the next one
  int keep_last_ = 0;                         // > 0: older checkpoints are removed
};

// The identity of a run, as the Checkpointer stores it: "key=value" pairs joined by ';', in a
// fixed order (exposed for tests and for trainers that log it).
std::string run_identity(const TrainingModel& model, const data::DataLoader& loader);

}  // namespace quintet::train
