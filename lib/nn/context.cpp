// Context: a microbatch's saved activations and its targets.
#include "quintet/nn/context.hpp"

#include "quintet/core/error.hpp"

namespace quintet::nn {

void Context::save(const Module& module, std::vector<Tensor> tensors) {
  push(module, std::any(std::move(tensors)));
}

std::vector<Tensor> Context::take(const Module& module) {
  return take_handle<std::vector<Tensor>>(module);
}

void Context::push(const Module& module, std::any saved) {
  if (forward_only_) return;  // no backward will take it
  saved_[&module].push_back(std::move(saved));
}

std::any Context::pop(const Module& module) {
  auto it = saved_.find(&module);
  QUINTET_CHECK(it != saved_.end() && !it->second.empty(),
                "Context::take: nothing saved for this module; call its forward on the same "
                "Context (one per microbatch) before its backward, once per forward");
  std::any out = std::move(it->second.back());
  it->second.pop_back();
  if (it->second.empty()) saved_.erase(it);
  return out;
}

void Context::wrong_type(const std::any& saved, const std::type_info& wanted) {
  QUINTET_THROW(InvalidArgument,
                "Context::take: the module saved a {} and its backward takes a {}; a forward and "
                "a backward of different kinds of save on one Context",
                saved.type().name(), wanted.name());
}

std::size_t Context::pending() const {
  std::size_t n = 0;
  for (const auto& [m, stack] : saved_) n += stack.size();
  return n;
}

void Context::set_targets(Tensor targets, float loss_scale) {
  QUINTET_CHECK(targets.defined(), "Context::set_targets: the targets are an undefined tensor");
  targets_ = std::move(targets);
  loss_scale_ = loss_scale;
}

const Tensor& Context::targets() const {
  QUINTET_CHECK(
      targets_.defined(),
      "Context: no targets for the loss; call ctx.set_targets(targets, loss_scale) on "
      "this microbatch's context before the forward of a model chunk that ends in a loss");
  return targets_;
}

void Context::move_deferred_to(Context& other) {
  for (auto& work : deferred_) other.deferred_.push_back(std::move(work));
  deferred_.clear();
}

void Context::run_deferred_gradients() {
  std::vector<std::function<void()>> work = std::move(deferred_);
  deferred_.clear();
  for (auto& w : work) w();
}

}  // namespace quintet::nn
