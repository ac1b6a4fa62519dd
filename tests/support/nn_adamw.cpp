// nn::AdamW (nn_adamw.hpp): the norm over this store, clip, the fused update of every parameter.
#include "support/nn_adamw.hpp"

#include <fmt/format.h>

#include <cmath>

namespace quintet::nn {

namespace {
// Why a parameter's gradient norm is not this rank's to take (empty when it is).
std::string spread_over_ranks(const Parameter& p) {
  const ParameterAttributes& a = p.attributes();
  if (!a.full_shape.empty() && shape_numel(a.full_shape) > p.numel()) {
    return fmt::format("a shard of a {} weight", shape_str(a.full_shape));
  }
  if (a.reduce_over_tp) return "a partial sum over tensor-parallel ranks";
  if (a.is_expert) return "an expert's weight";
  if (a.tied != TiedRole::none) return "one copy of a weight tied across model chunks";
  return {};
}
}  // namespace

AdamW::AdamW(ParameterStore& store, const AdamWConfig& config, const Stream& stream)
    : store_(store), config_(config) {
  QUINTET_CHECK(store.device() == stream.device(),
                "AdamW: the parameters are on {} but the stream is on {}", store.device().str(),
                stream.device().str());
  for (const Parameter* p : store.parameters()) {
    const std::string why = spread_over_ranks(*p);
    if (why.empty()) continue;
    local_norm_only_ = true;
    QUINTET_CHECK(config.max_grad_norm <= 0,
                  "nn::AdamW: parameter {} is {}, so its gradient norm is spread over several "
                  "ranks and clipping by this rank's norm would clip each rank differently (the "
                  "replicas drift apart). Use quintet::data_parallel::DistributedOptimizer over a "
                  "DataParallel "
                  "(quintet/parallel/data_parallel/distributed_optimizer.hpp), which takes the "
                  "norm over the whole job, or set max_grad_norm = 0",
                  p->name(), why);
  }
  // f32 (or f64) values are their own master; bf16 values get an f32 master copy.
  const DType state = accum_dtype(store.dtype());
  separate_master_ = store.dtype() != state;
  const Tensor& data = store.data_buffer();
  master_ = separate_master_ ? data.to(state, stream) : data;
  exp_avg_ = Tensor::empty(data.shape(), state, data.device(), stream);
  exp_avg_.fill_(0.0, stream);
  exp_avg_sq_ = Tensor::empty(data.shape(), state, data.device(), stream);
  exp_avg_sq_.fill_(0.0, stream);
}

OptimizerStepInfo AdamW::step(const Stream& stream) {
  QUINTET_CHECK(!store_.data_parallel(),
                "nn::AdamW::step: this store's gradients are reduced by a DataParallel (and "
                "under ZeRO only partly held here); step it with "
                "quintet::data_parallel::DistributedOptimizer "
                "(quintet/parallel/data_parallel/distributed_optimizer.hpp) over that "
                "DataParallel");
  const bool gpu = stream.device().is_cuda();
  std::shared_ptr<PendingNorm> pending;
  if (gpu) pending = next_pending_norm(&pending_, stream.device(), "AdamW::step");
  std::vector<Tensor> grads;
  std::vector<AdamWTensors> tensors;
  for (Parameter* p : store_.parameters()) {
    grads.push_back(p->grad());
    auto slice = [&](const Tensor& flat) {
      return flat.narrow(0, p->offset(), p->numel()).view(p->shape());
    };
    tensors.push_back({slice(master_), p->grad(), slice(exp_avg_), slice(exp_avg_sq_),
                       separate_master_ ? p->data() : Tensor(), p->attributes().weight_decay});
  }
  const Tensor sq = sum_of_squares(grads, stream);
  double norm = 0.0;
  if (!gpu) {  // free to read on the CPU: an inf or nan fails before anything changes
    norm = std::sqrt(sq.item());
    QUINTET_CHECK(std::isfinite(norm),
                  "AdamW::step: the gradient norm is {}; a gradient holds inf or nan", norm);
  }
  ++step_;
  adamw_step_many(tensors, config_.hyper, step_, sq, config_.max_grad_norm, stream);
  if (!gpu) {
    return OptimizerStepInfo::known(step_, norm, config_.max_grad_norm, local_norm_only_);
  }
  pending->record(sq, stream);
  return OptimizerStepInfo::pending(step_, std::move(pending), config_.max_grad_norm,
                                    local_norm_only_);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out = {
      {"step", Tensor::full({1}, static_cast<double>(step_), DType::i64)}};
  if (separate_master_) out.emplace_back("master", master_);
  out.emplace_back("exp_avg", exp_avg_);
  out.emplace_back("exp_avg_sq", exp_avg_sq_);
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                       const Stream& stream) {
  load_optimizer_state("AdamW::load_state", state, this->state(), &step_, stream);
}

}  // namespace quintet::nn
