// OnDemandGradients: ZeRO-2 gradient buffers bound for backward, shards and scratch shards (see
// on_demand_gradients.hpp).
#include "on_demand_gradients.hpp"

#include <algorithm>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::data_parallel {

OnDemandGradients::OnDemandGradients(nn::ParameterStore& store,
                                     const std::vector<GradientBucket>& buckets,
                                     const Stream& compute)
    : store_(store), buckets_(buckets), compute_(compute) {
  const DType grad_dtype = nn::accum_dtype(store.dtype());
  for (const GradientBucket& b : buckets) {
    Tensor owned = Tensor::empty({b.shard_size}, grad_dtype, store.device(), compute);
    owned.fill_(0.0, compute);
    resident_ += owned.nbytes();
    shard_.push_back(std::move(owned));
  }
  const std::size_t n = buckets.size();
  full_.assign(n, Tensor());
  scratch_.assign(n, Tensor());
  pending_.assign(n, Work());
  is_pending_.assign(n, 0);
  to_scratch_.assign(n, 0);
  reduced_.assign(n, 0);
  closed_.assign(n, 0);
  peak_ = resident_;
}

void OnDemandGradients::note_peak() { peak_ = std::max(peak_, bound_ + resident_); }

void OnDemandGradients::bind(int b) {
  const GradientBucket& k = buckets_[b];
  full_[b] =
      Tensor::empty({k.padded_numel()}, nn::accum_dtype(store_.dtype()), store_.device(), compute_);
  full_[b].fill_(0.0, compute_);  // layers accumulate; the padding tail is reduced as zeros
  store_.bind_gradients(k.params, full_[b], k.begin);
  bound_ += full_[b].nbytes();
  note_peak();
}

void OnDemandGradients::need(int b, const nn::Parameter& p) {
  QUINTET_CHECK(!closed_[b],
                "DataParallel (ZeRO-2): backward asked for the gradient of {} after its bucket was "
                "reduced in this microbatch; mark a parameter grad-ready only after its last "
                "gradient contribution of the microbatch",
                p.name());
  if (!full_[b].defined()) bind(b);
}

Tensor OnDemandGradients::gradient(int b) {
  if (!full_[b].defined()) bind(b);  // no gradient was asked for: it reduces as zeros
  return full_[b];
}

Tensor OnDemandGradients::output(int b) {
  to_scratch_[b] = reduced_[b];
  if (!reduced_[b]) return shard_[b];
  // A later microbatch: the earlier reduction (long finished) is folded into the shard first,
  // then this one lands in scratch.
  fold(b, compute_);
  if (!scratch_[b].defined()) {
    scratch_[b] =
        Tensor::empty({buckets_[b].shard_size}, shard_[b].dtype(), store_.device(), compute_);
    resident_ += scratch_[b].nbytes();
    note_peak();
  }
  return scratch_[b];
}

void OnDemandGradients::issued(int b, const Work& work) {
  if (to_scratch_[b]) {
    pending_[b] = work;
    is_pending_[b] = 1;
  }
  reduced_[b] = 1;
  // The full gradient is gone for this rank: the communicator holds its memory until the
  // reduction has read it, then it returns to the allocator.
  store_.unbind_gradients(buckets_[b].params);
  bound_ -= full_[b].nbytes();
  full_[b] = Tensor();
  closed_[b] = 1;
}

void OnDemandGradients::fold(int b, const Stream& stream) {
  if (!is_pending_[b]) return;
  pending_[b].wait(stream);
  nn::add_(shard_[b], scratch_[b], 1.0f, stream);
  pending_[b] = Work();
  is_pending_[b] = 0;
}

void OnDemandGradients::fold(const Stream& stream) {
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) fold(b, stream);
}

void OnDemandGradients::new_round() { std::fill(closed_.begin(), closed_.end(), 0); }

void OnDemandGradients::begin_step() {
  std::fill(reduced_.begin(), reduced_.end(), 0);
  peak_ = bound_ + resident_;
}

}  // namespace quintet::data_parallel
