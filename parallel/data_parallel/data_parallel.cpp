// DataParallel: the facade that checks its inputs and the step protocol, and composes the bucket
// plan, the reducer, ZeRO-2's on-demand gradients and the overlap meter (see data_parallel.hpp).
#include "quintet/parallel/data_parallel/data_parallel.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

#include "gradient_reducer.hpp"     // issues the reductions
#include "on_demand_gradients.hpp"  // ZeRO-2 gradient memory
#include "quintet/parallel/overlap/overlap_meter.hpp"

namespace quintet::data_parallel {

void DataParallelConfig::validate() const {
  QUINTET_CHECK(first_bucket_bytes > 0,
                "DataParallelConfig: first_bucket_bytes = {}; give a positive size in bytes "
                "(the default is 1 MiB)",
                first_bucket_bytes);
  QUINTET_CHECK(bucket_bytes > 0,
                "DataParallelConfig: bucket_bytes = {}; give a positive size in bytes (the "
                "default is 25 MiB)",
                bucket_bytes);
  QUINTET_CHECK(zero_stage >= 0 && zero_stage <= 2,
                "DataParallelConfig: zero_stage = {}; supported stages are 0 (replicated "
                "optimizer), 1 and 2 (sharded optimizer state)",
                zero_stage);
}

struct DataParallel::State {
  State(nn::ParameterStore& s, const Mesh& m, const DataParallelConfig& c, const Stream& st)
      : store(s), mesh(m), config(c), compute(st) {}

  nn::ParameterStore& store;
  const Mesh& mesh;
  DataParallelConfig config;
  const Stream& compute;
  // Declared in dependency order: the reducer (destroyed first) waits for its reductions before
  // the buffers they write go.
  std::optional<BucketPlan> plan;
  std::unordered_map<const nn::Parameter*, int> index;  // position in the plan (buffer order)
  overlap::OverlapMeter meter;
  std::unique_ptr<OnDemandGradients> zero2;  // stage 2 only
  std::unique_ptr<GradientReducer> reducer;
  std::int64_t resident = 0;  // stages 0, 1: the buffer and staging, kept across steps

  bool in_step = false;
  bool finished = false;
  bool any_finished = false;

  int index_of(const nn::Parameter& p) const {
    const auto it = index.find(&p);
    QUINTET_CHECK(it != index.end(), "DataParallel: parameter {} is not in this store", p.name());
    return it->second;
  }
  void on_grad_ready(nn::Parameter& p) {
    QUINTET_CHECK(in_step && !finished,
                  "DataParallel: parameter {} was marked grad-ready outside a step; call "
                  "begin_step() before the microbatches' backward and finish() after them",
                  p.name());
    reducer->on_grad_ready(p, index_of(p));
  }
  void on_grad_needed(nn::Parameter& p) {
    QUINTET_CHECK(in_step && !finished,
                  "DataParallel: backward asked for the gradient of {} outside a step; call "
                  "begin_step() before the microbatches' backward and finish() after them",
                  p.name());
    reducer->on_grad_needed(p, plan->bucket_of(index_of(p)));
  }
};

DataParallel::DataParallel(nn::ParameterStore& store, const Mesh& mesh,
                           const DataParallelConfig& config, const Stream& compute_stream)
    : state_(std::make_shared<State>(store, mesh, config, compute_stream)) {
  config.validate();
  const Device& device = store.device();
  QUINTET_CHECK(compute_stream.device() == device,
                "DataParallel: the parameters are on {} but the compute stream is on {}",
                device.str(), compute_stream.device().str());
  QUINTET_CHECK(!store.gradients_on_demand(),
                "DataParallel: this store's gradient buffer was released by a ZeRO-2 "
                "DataParallel; build one DataParallel per store");
  for (Axis axis : {Axis::dp_cp, Axis::edp, Axis::tp_dp_cp, Axis::pp}) {
    const Device cd = mesh.comm(axis).device();
    QUINTET_CHECK(cd == device,
                  "DataParallel: the parameters are on {} but the mesh's '{}' communicator moves "
                  "tensors on {}; build the store on the mesh's device (or the mesh on the "
                  "store's)",
                  device.str(), axis_name(axis), cd.str());
  }
  State& s = *state_;
  s.plan.emplace(store, config.first_bucket_bytes, config.bucket_bytes, GradientGroups::of(mesh));
  for (std::size_t i = 0; i < store.parameters().size(); ++i) {
    s.index[store.parameters()[i]] = static_cast<int>(i);
  }
  if (config.zero_stage == 2) {
    s.zero2 = std::make_unique<OnDemandGradients>(store, s.plan->buckets(), compute_stream);
  }
  s.reducer = std::make_unique<GradientReducer>(store, *s.plan, mesh, config, compute_stream,
                                                s.zero2.get(), s.meter);
  store.mark_data_parallel();  // only a distributed optimizer may step it now
  std::weak_ptr<State> weak = state_;
  store.add_grad_ready_hook([weak](nn::Parameter& p) {
    if (auto st = weak.lock()) st->on_grad_ready(p);
  });
  if (s.zero2) {
    store.release_gradient_buffer([weak](nn::Parameter& p, const Stream&) {
      if (auto st = weak.lock()) st->on_grad_needed(p);
    });
  } else {
    // What stays allocated from step to step (stage 2 counts its own shards and scratch).
    s.resident = store.grad_buffer().nbytes() + s.reducer->staging_bytes();
  }
}

// The reducer's destructor waits for outstanding reductions.
DataParallel::~DataParallel() = default;

void DataParallel::begin_step() {
  State& s = *state_;
  QUINTET_CHECK(!s.in_step || s.finished,
                "DataParallel::begin_step: the previous step was not finished; call finish() "
                "after the last microbatch's backward");
  s.store.zero_grad(s.compute);
  s.in_step = true;
  s.finished = false;
  s.reducer->begin_step();
}

void DataParallel::set_last_microbatch(bool last) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished,
                "DataParallel::set_last_microbatch: not inside a step; call begin_step() first");
  s.reducer->set_last_microbatch(last);
}

void DataParallel::finish(const Stream& stream) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished, "DataParallel::finish: {}",
                s.in_step ? "called twice in one step" : "no step in progress; call begin_step()");
  QUINTET_CHECK(stream.device() == s.store.device(),
                "DataParallel::finish: the stream is on {} but the gradients are on {}",
                stream.device().str(), s.store.device().str());
  s.reducer->finish(stream);
  s.finished = true;
  s.any_finished = true;
}

bool DataParallel::finished() const { return state_->in_step && state_->finished; }

DataParallelStats DataParallel::last_step_stats() const {
  const State& s = *state_;
  DataParallelStats stats;
  if (!s.any_finished) return stats;
  const overlap::OverlapTotals totals =
      s.meter.totals();  // blocks until the step's marks completed
  stats.comm_ms = totals.comm_ms;
  stats.exposed_ms = totals.exposed_ms;
  stats.bytes = s.reducer->bytes();
  stats.buckets = s.reducer->reductions();
  stats.peak_gradient_bytes = s.zero2 ? s.zero2->peak_bytes() : s.resident;
  return stats;
}

const std::vector<GradientBucket>& DataParallel::buckets() const { return state_->plan->buckets(); }
const BucketPlan& DataParallel::plan() const { return *state_->plan; }

Tensor DataParallel::owned_grad(int b) const {
  const State& s = *state_;
  const std::vector<GradientBucket>& buckets = s.plan->buckets();
  QUINTET_CHECK(b >= 0 && b < static_cast<int>(buckets.size()),
                "DataParallel::owned_grad: bucket {} of {}", b, buckets.size());
  QUINTET_CHECK(s.config.zero_stage > 0,
                "DataParallel::owned_grad: ZeRO stage 0 keeps the whole reduced gradient in the "
                "store's buffer; use store().grad_buffer()");
  const GradientBucket& k = buckets[b];
  const std::int64_t n = k.owned_end() - k.owned_begin();
  if (s.zero2) return s.zero2->shard(b).narrow(0, 0, n);
  const Tensor& staging = s.reducer->staging(b);
  if (staging.defined()) return staging.narrow(0, k.owned_begin() - k.begin, n);
  return s.store.grad_range(k.owned_begin(), n, s.compute);
}

Tensor DataParallel::reduced_grad(const nn::Parameter& p) const {
  const State& s = *state_;
  if (s.config.zero_stage == 0) return p.grad();
  const std::vector<GradientBucket>& buckets = s.plan->buckets();
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
    const auto& params = buckets[static_cast<std::size_t>(b)].params;
    if (std::find(params.begin(), params.end(), &p) != params.end()) return owned_grad(b);
  }
  QUINTET_THROW(InvalidArgument, "DataParallel::reduced_grad: {} is in no gradient bucket",
                p.name());
}

const DataParallelConfig& DataParallel::config() const { return state_->config; }
nn::ParameterStore& DataParallel::store() const { return state_->store; }
const Mesh& DataParallel::mesh() const { return state_->mesh; }
const Stream& DataParallel::compute_stream() const { return state_->compute; }

}  // namespace quintet::data_parallel
