#include "quintet/nn/module.hpp"

#include "quintet/nn/context.hpp"

namespace quintet::nn {

void Context::save(const Module& module, std::vector<Tensor> tensors) {
  saved_[&module].push_back(std::move(tensors));
}

std::vector<Tensor> Context::take(const Module& module) {
  auto it = saved_.find(&module);
  QUINTET_CHECK(it != saved_.end() && !it->second.empty(),
                "Context::take: nothing saved for this module; call its forward on the same "
                "Context (one per microbatch) before its backward, once per forward");
  std::vector<Tensor> out = std::move(it->second.back());
  it->second.pop_back();
  if (it->second.empty()) saved_.erase(it);
  return out;
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
  QUINTET_CHECK(targets_.defined(),
                "Context: no targets for the loss; call ctx.set_targets(targets, loss_scale) on "
                "this microbatch's context before the forward of a model chunk that ends in a loss");
  return targets_;
}

Parameter& Module::add_parameter(const std::string& name, const Shape& shape, ParameterInit init,
                                 ParameterAttributes attrs) {
  auto p = std::make_unique<Parameter>(name, shape, init, std::move(attrs));
  Parameter& ref = *p;
  entries_.push_back(Entry{name, std::move(p), nullptr});
  return ref;
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const Entry& e : entries_) {
    if (e.parameter) {
      out.emplace_back(e.name, e.parameter.get());
    } else {
      for (auto& [n, p] : e.module->named_parameters()) out.emplace_back(e.name + "." + n, p);
    }
  }
  return out;
}

std::vector<Parameter*> Module::parameters() const {
  std::vector<Parameter*> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

}  // namespace quintet::nn
