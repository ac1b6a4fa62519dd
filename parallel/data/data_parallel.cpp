// DataParallel: bucket planning, the grad-ready hook that issues reductions in bucket order, and
// the measurement of their cost (see data_parallel.hpp for the contract).
#include "quintet/parallel/data_parallel.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "quintet/nn/ops.hpp"

namespace quintet {

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

std::int64_t GradientBucket::owned_begin() const {
  return std::min(end, begin + static_cast<std::int64_t>(shard_rank) * shard_size);
}
std::int64_t GradientBucket::owned_end() const {
  return std::min(end, begin + static_cast<std::int64_t>(shard_rank + 1) * shard_size);
}

struct DataParallel::State {
  State(nn::ParameterStore& s, const Mesh& m, const DataParallelConfig& c, const Stream& st)
      : store(s), mesh(m), config(c), compute(st) {}

  nn::ParameterStore& store;
  const Mesh& mesh;
  DataParallelConfig config;
  const Stream& compute;
  bool gpu = false;
  Stream side;  // GPU: waits for each reduction, then records its end event

  std::vector<GradientBucket> buckets;
  std::vector<Communicator*> comms;  // per bucket
  std::vector<ReduceOp> ops;
  std::vector<float> prescale;  // applied to the bucket's gradient before a sum reduction
  std::vector<Tensor> staging;  // padded f32 copy for ZeRO when the group size does not divide
  std::unordered_map<const nn::Parameter*, std::pair<int, int>> where;  // bucket, param index

  // Per step.
  bool in_step = false;
  bool last_microbatch = true;
  bool finished = false;
  bool any_finished = false;
  int next_launch = 0;
  int first_unseen = 0;  // CPU: first bucket whose completion has not been observed
  std::vector<int> ready_count;
  std::vector<char> param_ready;
  std::vector<Work> works;
  std::vector<char> end_seen;
  std::int64_t bytes = 0;

  Event step_start, backward_end, done;
  std::vector<Event> start_events, end_events;

  void plan();
  void on_grad_ready(nn::Parameter& p);
  void launch(int b);
  void poll();
};

namespace {

// The group a parameter's gradient is reduced over.
Axis group_axis(const nn::Parameter& p, const Mesh& mesh) {
  const nn::ParameterAttributes& a = p.attributes();
  if (a.is_expert) {
    QUINTET_CHECK(!a.reduce_over_tp,
                  "DataParallel: expert parameter {} asks for reduce_over_tp; expert weights are "
                  "reduced over edp only (an expert norm replicated over etp is not supported)",
                  p.name());
    return Axis::edp;
  }
  return a.reduce_over_tp && mesh.size(Axis::tp) > 1 ? Axis::tp_dp_cp : Axis::dp_cp;
}

double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0.0, lo = 0.0, hi = 0.0;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (!open || s > hi) {
      if (open) total += hi - lo;
      lo = s, hi = e, open = true;
    } else {
      hi = std::max(hi, e);
    }
  }
  if (open) total += hi - lo;
  return total;
}

}  // namespace

void DataParallel::State::plan() {
  const std::vector<nn::Parameter*>& params = store.parameters();
  const std::int64_t grad_bytes =
      static_cast<std::int64_t>(dtype_size(store.grad_buffer().dtype()));
  auto aligned = [](std::int64_t n) {
    const std::int64_t a = nn::ParameterStore::kAlignElements;
    return (n + a - 1) / a * a;
  };
  std::vector<Axis> axes;
  for (const nn::Parameter* p : params) axes.push_back(group_axis(*p, mesh));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::int64_t size = aligned(params[i]->numel());
    // The first bucket closes at its own (small) limit; later buckets at bucket_bytes.
    const std::int64_t limit =
        buckets.size() <= 1 ? config.first_bucket_bytes : config.bucket_bytes;
    GradientBucket* cur = buckets.empty() ? nullptr : &buckets.back();
    const bool fits =
        cur != nullptr && cur->axis == axes[i] && (cur->numel() + size) * grad_bytes <= limit;
    if (!fits) {
      GradientBucket b;
      b.begin = params[i]->offset();
      b.end = b.begin;
      b.axis = axes[i];
      buckets.push_back(std::move(b));
      cur = &buckets.back();
    }
    cur->params.push_back(params[i]);
    cur->end = params[i]->offset() + size;
    where[params[i]] = {static_cast<int>(buckets.size()) - 1, static_cast<int>(i)};
  }
  for (GradientBucket& b : buckets) {
    Communicator& comm = mesh.comm(b.axis);
    b.shard_count = comm.size();
    b.shard_rank = comm.rank();
    b.shard_size = (b.numel() + b.shard_count - 1) / b.shard_count;
    comms.push_back(&comm);
    if (b.axis == Axis::tp_dp_cp) {
      ops.push_back(ReduceOp::sum);
      prescale.push_back(1.0f / static_cast<float>(mesh.size(Axis::dp_cp)));
    } else {
      ops.push_back(ReduceOp::avg);
      prescale.push_back(1.0f);
    }
    Tensor stage;
    if (config.zero_stage > 0 && b.shard_size * b.shard_count != b.numel()) {
      stage = Tensor::empty({b.shard_size * b.shard_count}, store.grad_buffer().dtype(),
                            store.device(), compute);
      stage.fill_(0.0, compute);  // the padding tail stays zero
    }
    staging.push_back(stage);
    start_events.emplace_back(store.device(), true);
    end_events.emplace_back(store.device(), true);
  }
  ready_count.assign(buckets.size(), 0);
  param_ready.assign(params.size(), 0);
  works.assign(buckets.size(), Work());
  end_seen.assign(buckets.size(), 0);
}

void DataParallel::State::launch(int b) {
  const GradientBucket& k = buckets[b];
  Tensor grad = store.grad_buffer().narrow(0, k.begin, k.numel());
  start_events[b].record(compute);
  if (prescale[b] != 1.0f) nn::scale_(grad, prescale[b], compute);
  if (config.zero_stage == 0) {
    works[b] = comms[b]->all_reduce(grad, grad, ops[b], compute);
  } else {
    Tensor in = grad;
    if (staging[b].defined()) {
      staging[b].narrow(0, 0, k.numel()).copy_(grad, compute);
      in = staging[b];
    }
    works[b] = comms[b]->reduce_scatter(in, in.narrow(0, k.shard_rank * k.shard_size, k.shard_size),
                                        ops[b], compute);
  }
  bytes += static_cast<std::int64_t>(k.shard_size * k.shard_count) *
           static_cast<std::int64_t>(dtype_size(grad.dtype()));
  if (gpu) {
    // The side stream idles between buckets: order it after the start too, so a reduction that
    // is no GPU work (a one-rank group) ends when it starts rather than before.
    start_events[b].wait(side);
    works[b].wait(side);
    end_events[b].record(side);
    end_seen[b] = 1;
  }
}

void DataParallel::State::poll() {
  // CPU: the end of a reduction is the first time the host sees its Work complete.
  for (int b = first_unseen; b < next_launch; ++b) {
    if (!end_seen[b] && works[b].is_completed()) {
      end_events[b].record(compute);
      end_seen[b] = 1;
    }
  }
  while (first_unseen < next_launch && end_seen[first_unseen]) ++first_unseen;
}

void DataParallel::State::on_grad_ready(nn::Parameter& p) {
  QUINTET_CHECK(in_step && !finished,
                "DataParallel: parameter {} was marked grad-ready outside a step; call "
                "begin_step() before the microbatches' backward and finish() after them",
                p.name());
  if (!last_microbatch) return;
  const auto it = where.find(&p);
  QUINTET_CHECK(it != where.end(), "DataParallel: parameter {} is not in this store", p.name());
  const auto [b, i] = it->second;
  QUINTET_CHECK(!param_ready[i],
                "DataParallel: parameter {} was marked grad-ready twice in one microbatch; its "
                "bucket may already be reducing (a weight used twice must be marked once, after "
                "its last gradient contribution)",
                p.name());
  param_ready[i] = 1;
  ++ready_count[b];
  if (config.overlap) {
    while (next_launch < static_cast<int>(buckets.size()) &&
           ready_count[next_launch] == static_cast<int>(buckets[next_launch].params.size())) {
      launch(next_launch++);
    }
  }
  if (!gpu) poll();
}

DataParallel::DataParallel(nn::ParameterStore& store, const Mesh& mesh,
                           const DataParallelConfig& config, const Stream& compute_stream)
    : state_(std::make_shared<State>(store, mesh, config, compute_stream)) {
  config.validate();
  const Device& device = store.device();
  QUINTET_CHECK(compute_stream.device() == device,
                "DataParallel: the parameters are on {} but the compute stream is on {}",
                device.str(), compute_stream.device().str());
  for (Axis axis : {Axis::dp_cp, Axis::edp, Axis::tp_dp_cp, Axis::pp}) {
    const Device cd = mesh.comm(axis).device();
    QUINTET_CHECK(cd == device,
                  "DataParallel: the parameters are on {} but the mesh's '{}' communicator moves "
                  "tensors on {}; build the store on the mesh's device (or the mesh on the "
                  "store's)",
                  device.str(), axis_name(axis), cd.str());
  }
  State& s = *state_;
  s.gpu = device.is_cuda();
  if (s.gpu) s.side = Stream::create(device);
  s.step_start = Event(device, true);
  s.backward_end = Event(device, true);
  s.done = Event(device, true);
  s.plan();
  std::weak_ptr<State> weak = state_;
  store.add_grad_ready_hook([weak](nn::Parameter& p) {
    if (auto st = weak.lock()) st->on_grad_ready(p);
  });
}

DataParallel::~DataParallel() {
  // Outstanding reductions must not write into buffers after their owner is gone: wait for them
  // (no throw from a destructor).
  try {
    for (int b = 0; b < state_->next_launch; ++b) state_->works[b].synchronize();
  } catch (...) {
  }
}

void DataParallel::begin_step() {
  State& s = *state_;
  QUINTET_CHECK(!s.in_step || s.finished,
                "DataParallel::begin_step: the previous step was not finished; call finish() "
                "after the last microbatch's backward");
  s.store.zero_grad(s.compute);
  s.step_start.record(s.compute);
  s.in_step = true;
  s.finished = false;
  s.last_microbatch = true;
  s.next_launch = 0;
  s.first_unseen = 0;
  s.bytes = 0;
  std::fill(s.ready_count.begin(), s.ready_count.end(), 0);
  std::fill(s.param_ready.begin(), s.param_ready.end(), 0);
  std::fill(s.end_seen.begin(), s.end_seen.end(), 0);
  std::fill(s.works.begin(), s.works.end(), Work());
}

void DataParallel::set_last_microbatch(bool last) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished,
                "DataParallel::set_last_microbatch: not inside a step; call begin_step() first");
  QUINTET_CHECK(s.next_launch == 0,
                "DataParallel::set_last_microbatch: reductions of this step have already started; "
                "the last microbatch must be the last one to run backward");
  s.last_microbatch = last;
  std::fill(s.ready_count.begin(), s.ready_count.end(), 0);
  std::fill(s.param_ready.begin(), s.param_ready.end(), 0);
}

void DataParallel::finish(const Stream& stream) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished, "DataParallel::finish: {}",
                s.in_step ? "called twice in one step" : "no step in progress; call begin_step()");
  QUINTET_CHECK(stream.device() == s.store.device(),
                "DataParallel::finish: the stream is on {} but the gradients are on {}",
                stream.device().str(), s.store.device().str());
  if (!s.gpu) s.poll();
  s.backward_end.record(stream);
  while (s.next_launch < static_cast<int>(s.buckets.size())) s.launch(s.next_launch++);
  for (int b = 0; b < s.next_launch; ++b) {
    if (!s.gpu) s.poll();
    s.works[b].wait(stream);
    if (!s.gpu && !s.end_seen[b]) {
      s.end_events[b].record(stream);
      s.end_seen[b] = 1;
    }
  }
  s.done.record(stream);
  s.finished = true;
  s.any_finished = true;
}

bool DataParallel::finished() const { return state_->in_step && state_->finished; }

DataParallelStats DataParallel::last_step_stats() const {
  const State& s = *state_;
  DataParallelStats stats;
  if (!s.any_finished) return stats;
  s.done.synchronize();
  std::vector<std::pair<double, double>> intervals;
  for (int b = 0; b < s.next_launch; ++b) {
    intervals.emplace_back(s.start_events[b].elapsed_ms(s.step_start),
                           s.end_events[b].elapsed_ms(s.step_start));
  }
  stats.comm_ms = union_length(std::move(intervals));
  stats.exposed_ms = std::max(0.0, static_cast<double>(s.done.elapsed_ms(s.backward_end)));
  stats.bytes = s.bytes;
  stats.buckets = s.next_launch;
  return stats;
}

const std::vector<GradientBucket>& DataParallel::buckets() const { return state_->buckets; }

Tensor DataParallel::owned_grad(int b) const {
  const State& s = *state_;
  QUINTET_CHECK(b >= 0 && b < static_cast<int>(s.buckets.size()),
                "DataParallel::owned_grad: bucket {} of {}", b, s.buckets.size());
  QUINTET_CHECK(s.config.zero_stage > 0,
                "DataParallel::owned_grad: ZeRO stage 0 keeps the whole reduced gradient in the "
                "store's buffer; use store().grad_buffer()");
  const GradientBucket& k = s.buckets[b];
  const std::int64_t n = k.owned_end() - k.owned_begin();
  if (s.staging[b].defined()) return s.staging[b].narrow(0, k.owned_begin() - k.begin, n);
  return s.store.grad_buffer().narrow(0, k.owned_begin(), n);
}

const DataParallelConfig& DataParallel::config() const { return state_->config; }
nn::ParameterStore& DataParallel::store() const { return state_->store; }
const Mesh& DataParallel::mesh() const { return state_->mesh; }
const Stream& DataParallel::compute_stream() const { return state_->compute; }

}  // namespace quintet
