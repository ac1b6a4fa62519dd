// DistributedOptimizer: AdamW on the elements this rank owns, the global gradient norm over the
// job, and the per-bucket parameter all-gathers of ZeRO (see distributed_optimizer.hpp).
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "quintet/core/trace.hpp"

namespace quintet::data_parallel {

namespace {

// Whether a parameter replicated over tp (etp for experts) is counted on this rank: everywhere
// when it is sharded there (a shard held by tp_replicas ranks: on the first of them), else on tp
// (etp) rank 0 only.
bool counted_over_tp(const nn::Parameter& p, const Mesh& mesh) {
  const nn::ParameterAttributes& a = p.attributes();
  if (a.is_expert) {
    const bool sharded = a.shard_axis == Axis::tp || a.shard_axis == Axis::etp;
    return sharded || mesh.rank(Axis::etp) == 0;
  }
  if (a.shard_axis == Axis::tp) return mesh.rank(Axis::tp) % a.tp_replicas == 0;
  return mesh.rank(Axis::tp) == 0;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(DataParallel& dp, const nn::AdamWConfig& config,
                                           const Stream& stream)
    : dp_(dp), config_(config), stage_(dp.config().zero_stage) {
  nn::ParameterStore& store = dp.store();
  QUINTET_CHECK(stream.device() == store.device(),
                "DistributedOptimizer: the parameters are on {} but the stream is on {}",
                store.device().str(), stream.device().str());
  const Mesh& mesh = dp.mesh();
  const std::vector<GradientBucket>& buckets = dp.buckets();
  std::int64_t total = 0;
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
    const GradientBucket& k = buckets[b];
    const std::int64_t lo = stage_ > 0 ? k.owned_begin() : k.begin;
    const std::int64_t hi = stage_ > 0 ? k.owned_end() : k.end;
    for (nn::Parameter* p : k.params) {
      const std::int64_t s = std::max(lo, p->offset());
      const std::int64_t e = std::min(hi, p->offset() + p->numel());
      if (e <= s) continue;
      bool in_norm = counted_over_tp(*p, mesh);
      if (stage_ == 0) {
        // Every rank of the reduction group holds the same reduced gradient: count it on one.
        in_norm = in_norm && mesh.rank(k.axis == Axis::edp ? Axis::edp : Axis::dp_cp) == 0;
      } else if (k.axis == Axis::tp_dp_cp) {
        in_norm = true;  // the shards over tp x dp x cp partition the (tp-replicated) parameter
      }
      // A weight tied across chunks is held twice with equal gradients: counted on its owner.
      in_norm = in_norm && p->attributes().tied != nn::TiedRole::copy;
      segments_.push_back(Segment{p, b, s, e - s, total, in_norm});
      total += e - s;
    }
  }
  const DType state = nn::accum_dtype(store.dtype());
  master_ = Tensor::empty({total}, state, store.device(), stream);
  exp_avg_ = Tensor::empty({total}, state, store.device(), stream);
  exp_avg_.fill_(0.0, stream);
  exp_avg_sq_ = Tensor::empty({total}, state, store.device(), stream);
  exp_avg_sq_.fill_(0.0, stream);
  for (const Segment& g : segments_) {
    const Tensor values = store.data_buffer().narrow(0, g.flat_offset, g.length);
    master_.narrow(0, g.state_offset, g.length).copy_(nn::cast(values, state, stream), stream);
  }
  if (stage_ > 0) {
    gathers_.assign(buckets.size(), Work());
    gather_pending_.assign(buckets.size(), false);
    for (const GradientBucket& k : buckets) {
      Tensor staging;
      if (k.shard_size * k.shard_count != k.numel()) {
        staging =
            Tensor::empty({k.shard_size * k.shard_count}, store.dtype(), store.device(), stream);
        staging.fill_(0.0, stream);
      }
      gather_staging_.push_back(staging);
    }
    store.set_before_use_hook([this](nn::Parameter& p, const Stream& s) {
      const std::vector<GradientBucket>& bs = dp_.buckets();
      const auto it = std::upper_bound(
          bs.begin(), bs.end(), p.offset(),
          [](std::int64_t offset, const GradientBucket& k) { return offset < k.begin; });
      wait_bucket(static_cast<int>(it - bs.begin()) - 1, s);
    });
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  if (stage_ == 0) return;
  dp_.store().set_before_use_hook({});
  // Leave the store's values current: nobody will wait for the gathers once the hook is gone.
  try {
    for (int b = 0; b < static_cast<int>(gathers_.size()); ++b) {
      wait_bucket(b, dp_.compute_stream());
    }
    dp_.compute_stream().synchronize();
  } catch (...) {
  }
}

void DistributedOptimizer::wait_bucket(int b, const Stream& stream) {
  if (b < 0 || b >= static_cast<int>(gather_pending_.size()) || !gather_pending_[b]) return;
  gather_pending_[b] = false;
  gathers_[b].wait(stream);
  if (gather_staging_[b].defined()) {
    const GradientBucket& k = dp_.buckets()[b];
    dp_.store()
        .data_buffer()
        .narrow(0, k.begin, k.numel())
        .copy_(gather_staging_[b].narrow(0, 0, k.numel()), stream);
  }
}

void DistributedOptimizer::wait_for_parameters(const Stream& stream) {
  for (int b = 0; b < static_cast<int>(gather_pending_.size()); ++b) wait_bucket(b, stream);
}

void DistributedOptimizer::gather_parameters(const Stream& stream) {
  const Tensor& data = dp_.store().data_buffer();
  const std::vector<GradientBucket>& buckets = dp_.buckets();
  const trace::KindScope zero(trace::TraceKind::zero);  // traced as ZeRO gathers, not dp
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
    const GradientBucket& k = buckets[b];
    Communicator& comm = dp_.mesh().comm(k.axis);
    const std::int64_t block = static_cast<std::int64_t>(k.shard_rank) * k.shard_size;
    if (!gather_staging_[b].defined()) {
      // In place: this rank's block of the bucket is the input.
      const Tensor out = data.narrow(0, k.begin, k.numel());
      gathers_[b] = comm.all_gather(out.narrow(0, block, k.shard_size), out, stream);
    } else {
      const Tensor& staging = gather_staging_[b];
      const std::int64_t owned = k.owned_end() - k.owned_begin();
      if (owned > 0) {
        staging.narrow(0, block, owned).copy_(data.narrow(0, k.owned_begin(), owned), stream);
      }
      gathers_[b] = comm.all_gather(staging.narrow(0, block, k.shard_size), staging, stream);
    }
    gather_pending_[b] = true;
  }
}

nn::OptimizerStepInfo DistributedOptimizer::step(const Stream& stream) {
  DistributedOptimizer* self = this;
  return step_together({&self, 1}, stream);
}

nn::OptimizerStepInfo DistributedOptimizer::step_together(
    std::span<DistributedOptimizer* const> optimizers, const Stream& stream) {
  QUINTET_CHECK(!optimizers.empty(), "DistributedOptimizer::step_together: no optimizers");
  const Mesh& mesh = optimizers.front()->dp_.mesh();
  Tensor sq;
  for (DistributedOptimizer* o : optimizers) {
    QUINTET_CHECK(&o->dp_.mesh() == &mesh,
                  "DistributedOptimizer::step_together: the optimizers' DataParallels must share "
                  "one mesh (the chunks of one rank)");
    const Tensor part = o->local_sum_of_squares(stream);
    if (sq.defined()) {
      QUINTET_CHECK(part.dtype() == sq.dtype(),
                    "DistributedOptimizer::step_together: chunks with different gradient dtypes "
                    "({} and {})",
                    dtype_name(sq.dtype()), dtype_name(part.dtype()));
      nn::add_(sq, part, 1.0f, stream);
    } else {
      sq = part;
    }
  }
  mesh.comm(Axis::tp_dp_cp).all_reduce(sq, ReduceOp::sum, stream).wait(stream);
  mesh.comm(Axis::pp).all_reduce(sq, ReduceOp::sum, stream).wait(stream);
  // On a GPU the update takes its clip factor from sq on the device, and the host reads the norm
  // only when asked for (OptimizerStepInfo). On the CPU it is read now, so that an inf or nan
  // fails before anything changes (every rank has the same norm, so every rank fails).
  DistributedOptimizer& first = *optimizers.front();
  const float max_norm = first.config_.max_grad_norm;
  if (stream.device().is_cuda()) {
    std::shared_ptr<nn::PendingNorm> pending =
        nn::next_pending_norm(&first.pending_, stream.device(), "DistributedOptimizer::step");
    std::int64_t step = 0;
    for (DistributedOptimizer* o : optimizers) step = o->apply(sq, stream);
    pending->record(sq, stream);
    return nn::OptimizerStepInfo::pending(step, std::move(pending), max_norm);
  }
  stream.synchronize();
  const double norm = std::sqrt(sq.item({0}));
  QUINTET_CHECK(std::isfinite(norm),
                "DistributedOptimizer::step: the gradient norm is {}; a gradient holds inf or nan",
                norm);
  std::int64_t step = 0;
  for (DistributedOptimizer* o : optimizers) step = o->apply(sq, stream);
  return nn::OptimizerStepInfo::known(step, norm, max_norm);
}

Tensor DistributedOptimizer::grad_of(const Segment& g) const {
  if (stage_ == 0) return dp_.store().grad_buffer().narrow(0, g.flat_offset, g.length);
  return dp_.owned_grad(g.bucket).narrow(0, g.flat_offset - dp_.buckets()[g.bucket].owned_begin(),
                                         g.length);
}

Tensor DistributedOptimizer::local_sum_of_squares(const Stream& stream) {
  QUINTET_CHECK(dp_.finished(),
                "DistributedOptimizer::step: the gradients are not reduced; call "
                "DataParallel::finish() after the last microbatch's backward");
  QUINTET_CHECK(stream.device() == dp_.store().device(),
                "DistributedOptimizer::step: the stream is on {} but the parameters are on {}",
                stream.device().str(), dp_.store().device().str());
  wait_for_parameters(stream);
  const nn::ParameterStore& store = dp_.store();

  std::vector<Tensor> counted;
  for (const Segment& g : segments_) {
    if (g.in_norm) counted.push_back(grad_of(g));
  }
  const DType acc = nn::accum_dtype(store.dtype());
  Tensor sq;
  if (counted.empty()) {
    sq = Tensor::empty({1}, acc, store.device(), stream);
    sq.fill_(0.0, stream);  // ordered on stream, before the all-reduce reads it
  } else {
    sq = nn::sum_of_squares(counted, stream).view({1});
  }
  if (sq.dtype() != acc) sq = nn::cast(sq, acc, stream);
  return sq;
}

std::int64_t DistributedOptimizer::apply(const Tensor& sum_sq, const Stream& stream) {
  const nn::ParameterStore& store = dp_.store();
  std::vector<nn::AdamWTensors> tensors;
  tensors.reserve(segments_.size());
  for (const Segment& g : segments_) {
    tensors.push_back({master_.narrow(0, g.state_offset, g.length), grad_of(g),
                       exp_avg_.narrow(0, g.state_offset, g.length),
                       exp_avg_sq_.narrow(0, g.state_offset, g.length),
                       store.data_buffer().narrow(0, g.flat_offset, g.length),
                       g.param->attributes().weight_decay});
  }
  nn::adamw_step_many(tensors, config_.hyper, ++step_, sum_sq, config_.max_grad_norm, stream);
  if (stage_ > 0) gather_parameters(stream);
  return step_;
}

std::vector<std::pair<std::string, Tensor>> DistributedOptimizer::state() const {
  return {{"step", Tensor::full({1}, static_cast<double>(step_), DType::i64)},
          {"master", master_},
          {"exp_avg", exp_avg_},
          {"exp_avg_sq", exp_avg_sq_}};
}

void DistributedOptimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                                      const Stream& stream) {
  nn::load_optimizer_state("DistributedOptimizer::load_state", state, this->state(), &step_,
                           stream);
}

std::vector<std::pair<std::string, Tensor>> DistributedOptimizer::full_state(
    const Stream& stream) const {
  const nn::ParameterStore& store = dp_.store();
  const std::int64_t n = store.data_buffer().numel();
  const DType acc = nn::accum_dtype(store.dtype());
  std::vector<std::pair<std::string, Tensor>> out;
  const std::pair<const char*, const Tensor*> mine[] = {
      {"master", &master_}, {"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  for (const auto& [name, state] : mine) {
    Tensor full = Tensor::empty({n}, acc, store.device(), stream);
    full.fill_(0.0, stream);
    for (const Segment& g : segments_) {
      full.narrow(0, g.flat_offset, g.length)
          .copy_(state->narrow(0, g.state_offset, g.length), stream);
    }
    if (stage_ > 0) {
      for (const GradientBucket& k : dp_.buckets()) {
        Tensor part = full.narrow(0, k.begin, k.numel());
        dp_.mesh().comm(k.axis).all_reduce(part, ReduceOp::sum, stream).wait(stream);
      }
    }
    out.emplace_back(name, full);
  }
  return out;
}

void DistributedOptimizer::load_full_state(const std::vector<std::pair<std::string, Tensor>>& full,
                                           std::int64_t step, const Stream& stream) {
  const nn::ParameterStore& store = dp_.store();
  const std::int64_t n = store.data_buffer().numel();
  const DType acc = nn::accum_dtype(store.dtype());
  QUINTET_CHECK(step >= 0, "DistributedOptimizer::load_full_state: step = {}", step);
  std::vector<std::pair<Tensor*, Tensor>> todo;
  const std::pair<const char*, Tensor*> mine[] = {
      {"master", &master_}, {"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  for (const auto& [name, state] : mine) {
    const auto it =
        std::find_if(full.begin(), full.end(), [&](const auto& f) { return f.first == name; });
    QUINTET_CHECK(it != full.end(), "DistributedOptimizer::load_full_state: no '{}' given", name);
    QUINTET_CHECK(it->second.defined() && it->second.numel() == n && it->second.dtype() == acc,
                  "DistributedOptimizer::load_full_state: '{}' is {}, expected {} elements of {}",
                  name, it->second.defined() ? it->second.str() : std::string("undefined"), n,
                  dtype_name(acc));
    todo.emplace_back(state, it->second.view({n}));
  }
  for (auto& [state, from] : todo) {
    for (const Segment& g : segments_) {
      state->narrow(0, g.state_offset, g.length)
          .copy_(from.narrow(0, g.flat_offset, g.length), stream);
    }
  }
  step_ = step;
}

void DistributedOptimizer::restart(const Stream& stream) {
  exp_avg_.fill_(0.0, stream);
  exp_avg_sq_.fill_(0.0, stream);
  step_ = 0;
}

void DistributedOptimizer::set_master(const nn::Parameter& p, const Tensor& value,
                                      const Stream& stream) {
  const nn::ParameterStore& store = dp_.store();
  const DType acc = nn::accum_dtype(store.dtype());
  QUINTET_CHECK(value.defined() && value.shape() == p.shape() && value.dtype() == acc,
                "DistributedOptimizer::set_master: {} is {}, expected {} of {}", p.name(),
                value.defined() ? value.str() : std::string("undefined"), shape_str(p.shape()),
                dtype_name(acc));
  const bool known = std::any_of(store.parameters().begin(), store.parameters().end(),
                                 [&](const nn::Parameter* q) { return q == &p; });
  QUINTET_CHECK(known, "DistributedOptimizer::set_master: {} is not in this optimizer's store",
                p.name());
  const Tensor flat = value.contiguous().view({p.numel()});
  for (const Segment& g : segments_) {
    if (g.param != &p) continue;
    master_.narrow(0, g.state_offset, g.length)
        .copy_(flat.narrow(0, g.flat_offset - p.offset(), g.length), stream);
  }
}

}  // namespace quintet::data_parallel
