// Evaluation: the loss of a model on held-out token windows, forward only
// (parallel/train/evaluate.cpp). Nothing of the model changes: no gradient, no optimizer step, no
// MoE statistic or balancing bias (the forwards run on forward-only contexts, which save nothing
// and count nothing: nn::Context::set_forward_only); there is no dropout to turn off.
//
//   train::TrainingModel model(job, mesh, stream);
//   train::Validation validation(train::open_validation_data(job, runtime), model,
//                                job.validation.batches);            // before the first step
//   ...
//   const train::Validation::Result r = validation.run(model);       // r.loss on every rank
//
// The windows are the data's, cut at the model's sequence length (data::Windows), read in window
// order from the first (no shuffle), global batch after global batch as a step reads them: one
// evaluation covers the same windows at every layout (tp, sp, pp and vpp, cp, dp and ZeRO, ep and
// etp), so its loss is the same up to the order of the sums.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "quintet/core/runtime_config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/data/token_dataset.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/pipeline/executor.hpp"
#include "quintet/parallel/train/job_config.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace quintet::train {

// The mean cross-entropy (nats/token, without the MoE auxiliary losses) of `microbatches`
// microbatches data(m) on each replica, by the forward passes alone (PipelineExecutor::forward):
// the last stage's sum to every stage (over pp), then the mean over the replicas and cp ranks,
// each holding an equal share of the tokens, as train::step's loss. The same value on every rank.
// data(m) is the executor's (this cp rank's part of the sequences). Collective over the mesh (and
// the model's own communicators); synchronises stream once.
double evaluate(pipeline::PipelineExecutor& executor, const Mesh& mesh, int microbatches,
                const std::function<pipeline::MicrobatchData(int)>& data, const Stream& stream);

// The validation data of a job: the shards of job.validation.data (TokenDataset::open), or with
// "builtin" the built-in dataset's validation shard (made where the training one is:
// job.builtin_dataset_dir(runtime)). Throws InvalidArgument, without any communication, when the
// glob matches nothing, or the data holds fewer windows of seq_len than job.validation.batches
// global batches (at least one), naming --val-data and the counts.
data::TokenDataset open_validation_data(const JobConfig& job, const RuntimeConfig& runtime);

// The training data of a job: job.data.shards, or the built-in dataset (made once in
// job.builtin_dataset_dir(runtime), by whichever rank gets there first, one folder per
// configuration so they never clash).
data::TokenDataset open_training_data(const JobConfig& job, const RuntimeConfig& runtime);

// The number of global batches an evaluation of `windows` windows reads: `batches`, or with 0 as
// many whole global batches as there are (the windows past the last whole one are left out, so
// every layout evaluates the same ones). Throws InvalidArgument when that is none or more than
// there are.
std::int64_t validation_batches(std::uint64_t windows, std::int64_t global_batch,
                                std::int64_t batches);

// Held-out windows for one model and their loss (above).
class Validation {
 public:
  struct Result {
    double loss = 0.0;         // the mean cross-entropy over the windows (nats/token), every rank
    std::int64_t windows = 0;  // windows evaluated, over all replicas
    double ms = 0.0;           // wall time of the evaluation on this rank
  };

  // The windows of dataset at model's seq_len, `batches` global batches of the model's
  // (micro_batch x microbatches x dp windows), 0: every whole one (validation_batches). Reads
  // ahead with `threads` loader threads from construction. Throws InvalidArgument, before any
  // communication, for a dataset with too few windows (validation_batches).
  Validation(data::TokenDataset dataset, const TrainingModel& model, std::int64_t batches = 0,
             int threads = 2);
  // The model's loss over the windows, from the first (every call the same windows). Collective
  // over the model's mesh.
  Result run(TrainingModel& model);

  std::int64_t batches() const { return batches_; }
  std::int64_t windows() const { return batches_ * global_batch_; }

 private:
  std::int64_t global_batch_ = 0;
  std::int64_t batches_ = 0;
  std::optional<data::DataLoader> loader_;
};

}  // namespace quintet::train
