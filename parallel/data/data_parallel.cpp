// DataParallel: bucket planning, the grad-ready hook that issues reductions in bucket order, and
// the measurement of their cost (see data_parallel.hpp for the contract).
#include "quintet/parallel/data/data_parallel.hpp"

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
  bool on_demand = false;  // ZeRO-2: gradients live in per-bucket buffers bound during backward
  Stream side;             // GPU: waits for each reduction, then records its end event

  std::vector<GradientBucket> buckets;
  std::vector<Communicator*> comms;  // per bucket
  std::vector<ReduceOp> ops;
  std::vector<float> prescale;  // applied to the bucket's gradient before a sum reduction
  std::vector<Tensor> staging;  // stage 1: padded f32 copy when the group size does not divide
  std::unordered_map<const nn::Parameter*, std::pair<int, int>> where;  // bucket, param index

  // ZeRO-2, per bucket.
  std::vector<Tensor> full;     // padded gradient while bound (this microbatch), else undefined
  std::vector<Tensor> shard;    // [shard_size] the reduced owned shard, summed over microbatches
  std::vector<Tensor> scratch;  // [shard_size] a later microbatch's reduction, added into shard
  std::vector<int> latest;      // this step's last launch of the bucket (index into launches)
  std::vector<char> closed;     // reduced in this microbatch: its gradient may not be asked again

  // One issued reduction.
  struct Launch {
    int bucket = 0;
    Work work;
    bool into_scratch = false;  // ZeRO-2: its result is in scratch, still to be added to shard
    bool end_seen = false;
  };

  // Per step.
  bool in_step = false;
  bool last_microbatch = true;
  bool finished = false;
  bool any_finished = false;
  bool round_open = false;       // ZeRO-2: this microbatch has bound or marked a gradient
  bool finished_called = false;  // finish() is running
  int next_launch = 0;           // next bucket to reduce in this round (microbatch)
  std::size_t ready_total = 0;   // parameters marked grad-ready in this round
  int first_unseen = 0;          // CPU: first launch whose completion has not been observed
  std::vector<int> ready_count;
  std::vector<char> param_ready;
  std::vector<Launch> launches;  // in issue order
  std::int64_t bytes = 0;
  std::int64_t bound_bytes = 0;  // ZeRO-2: bytes of full bucket buffers bound now
  std::int64_t peak_bytes = 0;   // the most gradient storage held at once this step
  std::int64_t resident = 0;  // gradient storage kept across steps: the buffer, staging or shards

  Event step_start, done;
  std::vector<Event> start_events, end_events;  // per launch, reused from step to step
  // Exposed windows [first, second]: the compute stream waiting for reductions after backward
  // (finish(); with stage 2 serialised also the end of each earlier microbatch). Pooled.
  std::vector<std::pair<Event, Event>> windows;
  int windows_used = 0;

  void plan();
  void on_grad_ready(nn::Parameter& p);
  void bind(int b);
  void on_grad_needed(nn::Parameter& p);
  void launch(int b);
  void close_round();
  Event& open_window();
  void wait_launches(int from, const Stream& stream);
  void absorb(Launch& l, const Stream& stream);
  void reset_round();
  void poll();
  void note_peak();
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
  const DType grad_dtype = nn::accum_dtype(store.dtype());
  const std::int64_t grad_bytes = static_cast<std::int64_t>(dtype_size(grad_dtype));
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
    Tensor stage, owned;
    if (config.zero_stage == 1 && b.shard_size * b.shard_count != b.numel()) {
      stage = Tensor::empty({b.shard_size * b.shard_count}, grad_dtype, store.device(), compute);
      stage.fill_(0.0, compute);  // the padding tail stays zero
    }
    if (config.zero_stage == 2) {
      owned = Tensor::empty({b.shard_size}, grad_dtype, store.device(), compute);
      owned.fill_(0.0, compute);
    }
    staging.push_back(stage);
    shard.push_back(owned);
  }
  const std::size_t nb = buckets.size();
  full.assign(nb, Tensor());
  scratch.assign(nb, Tensor());
  latest.assign(nb, -1);
  closed.assign(nb, 0);
  ready_count.assign(nb, 0);
  param_ready.assign(params.size(), 0);
}

void DataParallel::State::note_peak() { peak_bytes = std::max(peak_bytes, bound_bytes + resident); }

void DataParallel::State::bind(int b) {
  const GradientBucket& k = buckets[b];
  full[b] = Tensor::empty({k.shard_size * k.shard_count}, nn::accum_dtype(store.dtype()),
                          store.device(), compute);
  full[b].fill_(0.0, compute);  // layers accumulate; the padding tail is reduced as zeros
  store.bind_gradients(k.params, full[b], k.begin);
  bound_bytes += full[b].nbytes();
  note_peak();
}

void DataParallel::State::on_grad_needed(nn::Parameter& p) {
  QUINTET_CHECK(in_step && !finished,
                "DataParallel: backward asked for the gradient of {} outside a step; call "
                "begin_step() before the microbatches' backward and finish() after them",
                p.name());
  const auto it = where.find(&p);
  QUINTET_CHECK(it != where.end(), "DataParallel: parameter {} is not in this store", p.name());
  const int b = it->second.first;
  QUINTET_CHECK(!closed[b],
                "DataParallel (ZeRO-2): backward asked for the gradient of {} after its bucket was "
                "reduced in this microbatch; mark a parameter grad-ready only after its last "
                "gradient contribution of the microbatch",
                p.name());
  round_open = true;
  if (!full[b].defined()) bind(b);
}

void DataParallel::State::launch(int b) {
  const GradientBucket& k = buckets[b];
  const int index = static_cast<int>(launches.size());
  while (static_cast<int>(start_events.size()) <= index) {
    start_events.emplace_back(store.device(), true);
    end_events.emplace_back(store.device(), true);
  }
  start_events[index].record(compute);
  Launch l;
  l.bucket = b;
  if (on_demand) {
    if (!full[b].defined()) bind(b);  // no gradient was asked for: it reduces as zeros
    const Tensor grad = full[b];
    if (prescale[b] != 1.0f) nn::scale_(grad, prescale[b], compute);
    Tensor out = shard[b];
    if (latest[b] >= 0) {
      // A later microbatch: the earlier reduction (long finished) is folded into shard first,
      // then this one lands in scratch.
      absorb(launches[latest[b]], compute);
      if (!scratch[b].defined()) {
        scratch[b] = Tensor::empty({k.shard_size}, grad.dtype(), store.device(), compute);
        resident += scratch[b].nbytes();
        note_peak();
      }
      out = scratch[b];
      l.into_scratch = true;
    }
    l.work = comms[b]->reduce_scatter(grad, out, ops[b], compute);
    // The full gradient is gone for this rank: the communicator holds its memory until the
    // reduction has read it, then it returns to the allocator.
    store.unbind_gradients(k.params);
    bound_bytes -= full[b].nbytes();
    full[b] = Tensor();
    closed[b] = 1;
  } else {
    const Tensor grad = store.grad_buffer().narrow(0, k.begin, k.numel());
    if (prescale[b] != 1.0f) nn::scale_(grad, prescale[b], compute);
    if (config.zero_stage == 0) {
      l.work = comms[b]->all_reduce(grad, grad, ops[b], compute);
    } else {
      Tensor in = grad;
      if (staging[b].defined()) {
        staging[b].narrow(0, 0, k.numel()).copy_(grad, compute);
        in = staging[b];
      }
      l.work = comms[b]->reduce_scatter(in, in.narrow(0, k.shard_rank * k.shard_size, k.shard_size),
                                        ops[b], compute);
    }
  }
  bytes += static_cast<std::int64_t>(k.shard_size * k.shard_count) *
           static_cast<std::int64_t>(dtype_size(nn::accum_dtype(store.dtype())));
  if (gpu) {
    // The side stream idles between buckets: order it after the start too, so a reduction that
    // is no GPU work (a one-rank group) ends when it starts rather than before.
    start_events[index].wait(side);
    l.work.wait(side);
    end_events[index].record(side);
    l.end_seen = true;
  }
  latest[b] = index;
  launches.push_back(std::move(l));
}

void DataParallel::State::absorb(Launch& l, const Stream& stream) {
  if (!l.into_scratch) return;
  l.work.wait(stream);
  nn::add_(shard[l.bucket], scratch[l.bucket], 1.0f, stream);
  l.into_scratch = false;
}

void DataParallel::State::reset_round() {
  next_launch = 0;
  ready_total = 0;
  round_open = false;
  std::fill(ready_count.begin(), ready_count.end(), 0);
  std::fill(param_ready.begin(), param_ready.end(), 0);
  std::fill(closed.begin(), closed.end(), 0);
}

void DataParallel::State::close_round() {
  // Serialised stage 2 waits for each microbatch's reductions before the next one computes, so
  // that they are exposed as in stages 0, 1 (finish() closes the last round itself).
  const bool wait = on_demand && !config.overlap && !finished_called;
  const int from = static_cast<int>(launches.size());
  if (wait) open_window().record(compute);
  while (next_launch < static_cast<int>(buckets.size())) launch(next_launch++);
  reset_round();
  if (wait) {
    wait_launches(from, compute);
    windows[windows_used - 1].second.record(compute);
  }
}

Event& DataParallel::State::open_window() {
  if (windows_used == static_cast<int>(windows.size())) {
    windows.emplace_back(Event(store.device(), true), Event(store.device(), true));
  }
  return windows[windows_used++].first;
}

void DataParallel::State::wait_launches(int from, const Stream& stream) {
  for (int i = from; i < static_cast<int>(launches.size()); ++i) {
    Launch& l = launches[i];
    if (!gpu) poll();
    l.work.wait(stream);
    if (!gpu && !l.end_seen) {
      end_events[i].record(stream);
      l.end_seen = true;
    }
  }
}

void DataParallel::State::poll() {
  // CPU: the end of a reduction is the first time the host sees its Work complete.
  const int n = static_cast<int>(launches.size());
  for (int i = first_unseen; i < n; ++i) {
    if (!launches[i].end_seen && launches[i].work.is_completed()) {
      end_events[i].record(compute);
      launches[i].end_seen = true;
    }
  }
  while (first_unseen < n && launches[first_unseen].end_seen) ++first_unseen;
}

void DataParallel::State::on_grad_ready(nn::Parameter& p) {
  QUINTET_CHECK(in_step && !finished,
                "DataParallel: parameter {} was marked grad-ready outside a step; call "
                "begin_step() before the microbatches' backward and finish() after them",
                p.name());
  // Stages 0, 1 reduce once, after the last microbatch; stage 2 reduces every microbatch, so
  // that no full gradient outlives its microbatch's backward.
  if (!last_microbatch && !on_demand) return;
  const auto it = where.find(&p);
  QUINTET_CHECK(it != where.end(), "DataParallel: parameter {} is not in this store", p.name());
  const auto [b, i] = it->second;
  QUINTET_CHECK(!param_ready[i],
                "DataParallel: parameter {} was marked grad-ready twice in one microbatch; its "
                "bucket may already be reducing (a weight used twice must be marked once, after "
                "its last gradient contribution)",
                p.name());
  param_ready[i] = 1;
  ++ready_total;
  round_open = true;
  ++ready_count[b];
  if (config.overlap) {
    while (next_launch < static_cast<int>(buckets.size()) &&
           ready_count[next_launch] == static_cast<int>(buckets[next_launch].params.size())) {
      launch(next_launch++);
    }
  }
  if (on_demand && ready_total == param_ready.size()) {
    close_round();  // every gradient of the microbatch is complete
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
  s.gpu = device.is_cuda();
  if (s.gpu) s.side = Stream::create(device);
  s.step_start = Event(device, true);
  s.done = Event(device, true);
  s.plan();
  std::weak_ptr<State> weak = state_;
  store.add_grad_ready_hook([weak](nn::Parameter& p) {
    if (auto st = weak.lock()) st->on_grad_ready(p);
  });
  if (config.zero_stage == 2) {
    s.on_demand = true;
    store.release_gradient_buffer([weak](nn::Parameter& p, const Stream&) {
      if (auto st = weak.lock()) st->on_grad_needed(p);
    });
  }
  // What stays allocated from step to step (stage 2 adds scratch shards when it needs them).
  s.resident = s.on_demand ? 0 : store.grad_buffer().nbytes();
  for (const Tensor& t : s.on_demand ? s.shard : s.staging)
    s.resident += t.defined() ? t.nbytes() : 0;
}

DataParallel::~DataParallel() {
  // Outstanding reductions must not write into buffers after their owner is gone: wait for them
  // (no throw from a destructor).
  try {
    for (State::Launch& l : state_->launches) l.work.synchronize();
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
  s.first_unseen = 0;
  s.bytes = 0;
  s.launches.clear();
  s.windows_used = 0;
  std::fill(s.latest.begin(), s.latest.end(), -1);
  s.reset_round();
  s.peak_bytes = s.bound_bytes + s.resident;
}

void DataParallel::set_last_microbatch(bool last) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished,
                "DataParallel::set_last_microbatch: not inside a step; call begin_step() first");
  if (s.on_demand) {
    // A new microbatch: the previous one's backward is over, so its buckets not reduced yet (a
    // parameter it never marked) reduce now.
    if (s.round_open) s.close_round();
  } else {
    QUINTET_CHECK(s.next_launch == 0,
                  "DataParallel::set_last_microbatch: reductions of this step have already "
                  "started; the last microbatch must be the last one to run backward");
    s.reset_round();
  }
  s.last_microbatch = last;
}

void DataParallel::finish(const Stream& stream) {
  State& s = *state_;
  QUINTET_CHECK(s.in_step && !s.finished, "DataParallel::finish: {}",
                s.in_step ? "called twice in one step" : "no step in progress; call begin_step()");
  QUINTET_CHECK(stream.device() == s.store.device(),
                "DataParallel::finish: the stream is on {} but the gradients are on {}",
                stream.device().str(), s.store.device().str());
  if (!s.gpu) s.poll();
  s.finished_called = true;
  s.open_window().record(stream);  // backward's compute is queued: the rest is waiting
  if (!s.on_demand) {
    while (s.next_launch < static_cast<int>(s.buckets.size())) s.launch(s.next_launch++);
  } else if (s.round_open || s.launches.empty()) {
    s.close_round();  // a step whose backward marked nothing still reduces (zeros)
  }
  s.wait_launches(0, stream);
  for (State::Launch& l : s.launches) s.absorb(l, stream);
  s.windows[s.windows_used - 1].second.record(stream);
  s.done.record(stream);
  s.finished = true;
  s.finished_called = false;
  s.any_finished = true;
}

bool DataParallel::finished() const { return state_->in_step && state_->finished; }

DataParallelStats DataParallel::last_step_stats() const {
  const State& s = *state_;
  DataParallelStats stats;
  if (!s.any_finished) return stats;
  s.done.synchronize();
  std::vector<std::pair<double, double>> intervals;
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    intervals.emplace_back(s.start_events[i].elapsed_ms(s.step_start),
                           s.end_events[i].elapsed_ms(s.step_start));
  }
  stats.comm_ms = union_length(std::move(intervals));
  for (int w = 0; w < s.windows_used; ++w) {
    stats.exposed_ms +=
        std::max(0.0, static_cast<double>(s.windows[w].second.elapsed_ms(s.windows[w].first)));
  }
  stats.bytes = s.bytes;
  stats.buckets = static_cast<int>(s.launches.size());
  stats.peak_gradient_bytes = s.peak_bytes;
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
  if (s.on_demand) return s.shard[b].narrow(0, 0, n);
  if (s.staging[b].defined()) return s.staging[b].narrow(0, k.owned_begin() - k.begin, n);
  return s.store.grad_buffer().narrow(0, k.owned_begin(), n);
}

const DataParallelConfig& DataParallel::config() const { return state_->config; }
nn::ParameterStore& DataParallel::store() const { return state_->store; }
const Mesh& DataParallel::mesh() const { return state_->mesh; }
const Stream& DataParallel::compute_stream() const { return state_->compute; }

}  // namespace quintet
