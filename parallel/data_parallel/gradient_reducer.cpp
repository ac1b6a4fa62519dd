// GradientReducer: the grad-ready hook that issues reductions in bucket order, the rounds of
// microbatches, finish(), and the meter's marks (see gradient_reducer.hpp).
#include "gradient_reducer.hpp"

#include <algorithm>
#include <utility>

#include "quintet/core/trace.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::data_parallel {

GradientReducer::GradientReducer(nn::ParameterStore& store, const BucketPlan& plan,
                                 const Mesh& mesh, const DataParallelConfig& config,
                                 const Stream& compute, OnDemandGradients* zero2,
                                 overlap::OverlapMeter& meter)
    : store_(store),
      plan_(plan),
      buckets_(plan.buckets()),
      config_(config),
      compute_(compute),
      zero2_(zero2),
      meter_(meter) {
  gpu_ = store.device().is_cuda();
  if (gpu_) side_ = Stream::create(store.device());
  const DType grad_dtype = nn::accum_dtype(store.dtype());
  for (const GradientBucket& b : buckets_) {
    comms_.push_back(&mesh.comm(b.axis));
    if (b.axis == Axis::tp_dp_cp || b.axis == Axis::edp) {
      // Partial sums over tp, mean over dp_cp: one sum of the gradient pre-scaled by 1/|dp_cp|.
      // Experts: each expert's copy on an edp rank holds the sum over the tokens that every
      // dense replica of its ep group sent it, so the mean over the dp x cp replicas is the sum
      // over edp divided by |dp_cp| (not by |edp|, unless ep = 1 and etp = tp).
      ops_.push_back(ReduceOp::sum);
      prescale_.push_back(1.0f / static_cast<float>(plan.groups().dp_cp.size));
    } else {
      ops_.push_back(ReduceOp::avg);
      prescale_.push_back(1.0f);
    }
    Tensor stage;
    if (config.zero_stage == 1 && b.padded_numel() != b.numel()) {
      stage = Tensor::empty({b.padded_numel()}, grad_dtype, store.device(), compute);
      stage.fill_(0.0, compute);  // the padding tail stays zero
    }
    staging_.push_back(stage);
  }
  ready_count_.assign(buckets_.size(), 0);
  param_ready_.assign(plan.parameters().size(), 0);
}

GradientReducer::~GradientReducer() {
  // Outstanding reductions must not write into buffers after their owner is gone: wait for them
  // (no throw from a destructor).
  try {
    for (Launch& l : launches_) l.work.synchronize();
  } catch (...) {
  }
}

std::int64_t GradientReducer::staging_bytes() const {
  std::int64_t total = 0;
  for (const Tensor& t : staging_) total += t.defined() ? t.nbytes() : 0;
  return total;
}

void GradientReducer::launch(int b) {
  const GradientBucket& k = buckets_[b];
  Launch l;
  l.bucket = b;
  l.in_flight =
      meter_.begin(overlap::OverlapKind::in_flight, compute_);  // its inputs are ready there
  if (zero2_ != nullptr) {
    const Tensor grad = zero2_->gradient(b);
    if (prescale_[b] != 1.0f) nn::scale_(grad, prescale_[b], compute_);
    const Tensor out = zero2_->output(b);
    l.work = comms_[b]->reduce_scatter(grad, out, ops_[b], compute_);
    zero2_->issued(b, l.work);
  } else {
    // A gradient nothing wrote this step (lazily zeroed, see nn::ParameterStore) is zeroed here.
    const Tensor grad = store_.grad_range(k.begin, k.numel(), compute_);
    if (prescale_[b] != 1.0f) nn::scale_(grad, prescale_[b], compute_);
    if (config_.zero_stage == 0) {
      l.work = comms_[b]->all_reduce(grad, grad, ops_[b], compute_);
    } else {
      Tensor in = grad;
      if (staging_[b].defined()) {
        staging_[b].narrow(0, 0, k.numel()).copy_(grad, compute_);
        in = staging_[b];
      }
      l.work = comms_[b]->reduce_scatter(
          in, in.narrow(0, k.shard_rank * k.shard_size, k.shard_size), ops_[b], compute_);
    }
  }
  bytes_ +=
      k.padded_numel() * static_cast<std::int64_t>(dtype_size(nn::accum_dtype(store_.dtype())));
  if (gpu_) {
    // The side stream idles between buckets: order it after the start too, so a reduction that
    // is no GPU work (a one-rank group) ends when it starts rather than before.
    l.in_flight->wait_for_start(side_);
    {
      const trace::UntracedWaits untraced;  // marks the end; the compute stream does not wait
      l.work.wait(side_);
    }
    l.in_flight->end(side_);
  }
  launches_.push_back(std::move(l));
}

void GradientReducer::reset_round() {
  next_launch_ = 0;
  ready_total_ = 0;
  round_open_ = false;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  if (zero2_ != nullptr) zero2_->new_round();
}

void GradientReducer::close_round() {
  // Serialised stage 2 waits for each microbatch's reductions before the next one computes, so
  // that they are exposed as in stages 0, 1 (finish() closes the last round itself).
  const bool wait = zero2_ != nullptr && !config_.overlap && !finishing_;
  const int from = static_cast<int>(launches_.size());
  if (wait) exposed_.push_back(meter_.begin(overlap::OverlapKind::exposed, compute_));
  while (next_launch_ < static_cast<int>(buckets_.size())) launch(next_launch_++);
  reset_round();
  if (wait) {
    wait_launches(from, compute_);
    exposed_.back()->end(compute_);
  }
}

void GradientReducer::wait_launches(int from, const Stream& stream) {
  for (int i = from; i < static_cast<int>(launches_.size()); ++i) {
    Launch& l = launches_[i];
    if (!gpu_) poll();
    l.work.wait(stream);
    if (!gpu_) l.in_flight->end(stream);  // unless the poll saw it complete first
  }
}

void GradientReducer::poll() {
  // CPU: the end of a reduction is the first time the host sees its Work complete.
  const int n = static_cast<int>(launches_.size());
  for (int i = first_unseen_; i < n; ++i) {
    Launch& l = launches_[i];
    if (!l.in_flight->ended() && l.work.is_completed()) l.in_flight->end(compute_);
  }
  while (first_unseen_ < n && launches_[first_unseen_].in_flight->ended()) ++first_unseen_;
}

void GradientReducer::begin_step() {
  last_microbatch_ = true;
  first_unseen_ = 0;
  bytes_ = 0;
  launches_.clear();
  exposed_.clear();
  if (zero2_ != nullptr) zero2_->begin_step();
  reset_round();
  meter_.start_window(compute_);  // the origin of the step's in-flight timeline
}

void GradientReducer::set_last_microbatch(bool last) {
  if (zero2_ != nullptr) {
    // A new microbatch: the previous one's backward is over, so its buckets not reduced yet (a
    // parameter it never marked) reduce now.
    if (round_open_) close_round();
  } else {
    QUINTET_CHECK(next_launch_ == 0,
                  "DataParallel::set_last_microbatch: reductions of this step have already "
                  "started; the last microbatch must be the last one to run backward");
    reset_round();
  }
  last_microbatch_ = last;
}

void GradientReducer::on_grad_ready(const nn::Parameter& p, int i) {
  // Stages 0, 1 reduce once, after the last microbatch; stage 2 reduces every microbatch, so
  // that no full gradient outlives its microbatch's backward.
  if (!last_microbatch_ && zero2_ == nullptr) return;
  QUINTET_CHECK(!param_ready_[i],
                "DataParallel: parameter {} was marked grad-ready twice in one microbatch; its "
                "bucket may already be reducing (a weight used twice must be marked once, after "
                "its last gradient contribution)",
                p.name());
  param_ready_[i] = 1;
  ++ready_total_;
  round_open_ = true;
  ++ready_count_[plan_.bucket_of(i)];
  if (config_.overlap) {
    while (next_launch_ < static_cast<int>(buckets_.size()) &&
           ready_count_[next_launch_] == buckets_[next_launch_].num_params) {
      launch(next_launch_++);
    }
  }
  if (zero2_ != nullptr && ready_total_ == param_ready_.size()) {
    close_round();  // every gradient of the microbatch is complete
  }
  if (!gpu_) poll();
}

void GradientReducer::on_grad_needed(const nn::Parameter& p, int b) {
  zero2_->need(b, p);
  round_open_ = true;
}

void GradientReducer::finish(const Stream& stream) {
  if (!gpu_) poll();
  finishing_ = true;
  // Backward's compute is queued on stream: from here on it waits for the reductions.
  exposed_.push_back(meter_.begin(overlap::OverlapKind::exposed, stream));
  if (zero2_ == nullptr) {
    while (next_launch_ < static_cast<int>(buckets_.size())) launch(next_launch_++);
  } else if (round_open_ || launches_.empty()) {
    close_round();  // a step whose backward marked nothing still reduces (zeros)
  }
  wait_launches(0, stream);
  if (zero2_ != nullptr) zero2_->fold(stream);
  exposed_.back()->end(stream);
  finishing_ = false;
}

}  // namespace quintet::data_parallel
