// The loss of held-out windows, forward only (see evaluate.hpp).
#include "quintet/parallel/train/evaluate.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/data/synthetic.hpp"

namespace quintet::train {

double evaluate(pipeline::PipelineExecutor& executor, const Mesh& mesh, int microbatches,
                const std::function<pipeline::MicrobatchData(int)>& data, const Stream& stream) {
  Tensor loss;
  {
    const trace::Range range(trace::TraceKind::compute, "evaluate", stream);
    loss = executor.forward(microbatches, data, stream);
  }
  // As train::step's: the last stage's sum to every stage, then the mean over dp x cp.
  if (!loss.defined()) {
    loss = Tensor::empty({}, DType::f32, stream.device(), stream);
    loss.fill_(0.0, stream);
  }
  if (mesh.size(Axis::pp) > 1) {
    mesh.comm(Axis::pp).all_reduce(loss, ReduceOp::sum, stream).wait(stream);
  }
  mesh.comm(Axis::dp_cp).all_reduce(loss, ReduceOp::avg, stream).wait(stream);
  const Tensor host = loss.to(Device::cpu(), stream);
  stream.synchronize();
  return host.item() / microbatches;
}

namespace {

// The built-in dataset of job (made on first use), one folder per configuration.
data::SyntheticDataset builtin_dataset(const JobConfig& job, const RuntimeConfig& runtime) {
  data::SyntheticConfig synthetic;
  synthetic.order = job.data.synthetic_order;
  return data::ensure_synthetic_dataset(
      job.builtin_dataset_dir(runtime) + "/" + synthetic.describe(), synthetic);
}

}  // namespace

data::TokenDataset open_training_data(const JobConfig& job, const RuntimeConfig& runtime) {
  if (!job.data.shards.empty()) return data::TokenDataset::open(job.data.shards);
  return data::TokenDataset::open(
      fmt::format("{}", fmt::join(builtin_dataset(job, runtime).train, ",")));
}

data::TokenDataset open_validation_data(const JobConfig& job, const RuntimeConfig& runtime) {
  const std::string& spec = job.validation.data;
  QUINTET_CHECK(!spec.empty(), "open_validation_data: the job has no --val-data");
  // (TokenDataset::open names a glob that matches nothing; Windows a file too short.)
  data::TokenDataset dataset = data::TokenDataset::open(
      spec == "builtin" ? fmt::format("{}", fmt::join(builtin_dataset(job, runtime).val, ","))
                        : spec);
  (void)validation_batches(data::Windows(dataset, job.model.seq_len).count(),
                           job.training.global_batch, job.validation.batches);
  return dataset;
}

std::int64_t validation_batches(std::uint64_t windows, std::int64_t global_batch,
                                std::int64_t batches) {
  QUINTET_CHECK(global_batch >= 1 && batches >= 0,
                "validation_batches: global batch {} (>= 1), batches {} (>= 0)", global_batch,
                batches);
  const auto whole = static_cast<std::int64_t>(windows / static_cast<std::uint64_t>(global_batch));
  QUINTET_CHECK(whole >= 1,
                "the validation data (--val-data) holds {} windows, fewer than one global batch "
                "of {}; give more data or a smaller global batch",
                windows, global_batch);
  QUINTET_CHECK(batches <= whole,
                "--val-batches {}: global batches of {} windows, and the validation data holds {} "
                "windows, {} whole batches; ask for at most {} (0: all)",
                batches, global_batch, windows, whole, whole);
  return batches > 0 ? batches : whole;
}

Validation::Validation(data::TokenDataset dataset, const TrainingModel& model, std::int64_t batches,
                       int threads)
    : global_batch_(model.config().global_batch(model.mesh())) {
  const data::Windows windows(dataset, model.config().model.seq_len);
  batches_ = validation_batches(windows.count(), global_batch_, batches);
  data::LoaderConfig base;
  base.threads = threads;
  base.shuffle = false;  // window order, from the first
  loader_.emplace(std::move(dataset), model.loader_config(base));
}

Validation::Result Validation::run(TrainingModel& model) {
  const auto t0 = std::chrono::steady_clock::now();
  if (loader_->state().epoch != 0 || loader_->state().sample_index != 0) loader_->seek({});
  Result r;
  r.loss = model.evaluate(*loader_, batches_);
  r.windows = windows();
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace quintet::train
