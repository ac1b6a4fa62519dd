#include "quintet/nn/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace quintet::nn {

PendingNorm::PendingNorm(const Device& device, std::string who)
    : who_(std::move(who)), host_(Tensor::empty_pinned({1}, DType::f32)), ready_(device) {}

void PendingNorm::record(const Tensor& sum_sq, const Stream& stream) {
  host_.copy_(sum_sq.view({1}), stream);
  ready_.record(stream);
}

double PendingNorm::norm() {
  ready_.synchronize();
  const double norm = std::sqrt(host_.item({0}));
  QUINTET_CHECK(std::isfinite(norm),
                "{}: the gradient norm is {}; a gradient holds inf or nan (that step updated "
                "nothing)",
                who_, norm);
  return norm;
}

std::shared_ptr<PendingNorm> next_pending_norm(std::shared_ptr<PendingNorm>* slot,
                                               const Device& device, const std::string& who) {
  if (*slot != nullptr) (*slot)->norm();  // the previous step's: throws if it was not finite
  if (*slot == nullptr || slot->use_count() > 1) *slot = std::make_shared<PendingNorm>(device, who);
  return *slot;
}

OptimizerStepInfo OptimizerStepInfo::known(std::int64_t step, double norm, float max_grad_norm,
                                           bool local_only) {
  OptimizerStepInfo info;
  info.step = step;
  info.norm_ = norm;
  info.max_grad_norm_ = max_grad_norm;
  info.local_only_ = local_only;
  return info;
}

OptimizerStepInfo OptimizerStepInfo::pending(std::int64_t step, std::shared_ptr<PendingNorm> norm,
                                             float max_grad_norm, bool local_only) {
  OptimizerStepInfo info = known(step, 0.0, max_grad_norm, local_only);
  info.pending_ = std::move(norm);
  return info;
}

void OptimizerStepInfo::resolve() const {
  if (pending_ == nullptr) return;
  norm_ = pending_->norm();
  pending_.reset();
}

double OptimizerStepInfo::grad_norm() const {
  resolve();
  return local_only_ ? std::numeric_limits<double>::quiet_NaN() : norm_;
}

float OptimizerStepInfo::grad_scale() const {
  resolve();
  return clip_scale(norm_, max_grad_norm_);
}

void load_optimizer_state(const char* who, const std::vector<std::pair<std::string, Tensor>>& state,
                          const std::vector<std::pair<std::string, Tensor>>& expected,
                          std::int64_t* step, const Stream& stream) {
  std::string names;
  for (const auto& [name, t] : expected) names += (names.empty() ? "" : ", ") + name;
  QUINTET_CHECK(state.size() == expected.size(), "{}: {} tensors given, expected {} ({})", who,
                state.size(), expected.size(), names);
  std::set<std::string> seen;
  for (const auto& [name, t] : state) {
    QUINTET_CHECK(seen.insert(name).second, "{}: '{}' given twice", who, name);
    const auto it = std::find_if(expected.begin(), expected.end(),
                                 [&](const auto& m) { return m.first == name; });
    QUINTET_CHECK(it != expected.end(), "{}: unknown tensor '{}' (expected {})", who, name, names);
    QUINTET_CHECK(t.defined() && t.shape() == it->second.shape() && t.dtype() == it->second.dtype(),
                  "{}: '{}' is {}, expected shape {} and dtype {} (was the state saved with the "
                  "same model, layout and settings?)",
                  who, name, t.defined() ? t.str() : std::string("undefined"),
                  shape_str(it->second.shape()), dtype_name(it->second.dtype()));
    if (name == "step") QUINTET_CHECK(t.item({0}) >= 0, "{}: step = {}", who, t.item({0}));
  }
  for (const auto& [name, t] : state) {
    if (name == "step") {
      *step = static_cast<std::int64_t>(t.item({0}));
      continue;
    }
    const auto it = std::find_if(expected.begin(), expected.end(),
                                 [&](const auto& m) { return m.first == name; });
    Tensor dst = it->second;
    dst.copy_(t, stream);
  }
}

}  // namespace quintet::nn
