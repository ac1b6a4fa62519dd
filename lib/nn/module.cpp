#include "quintet/nn/module.hpp"

namespace quintet::nn {

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
      // A child under "" (a transparent wrapper such as Recompute) adds no level to the names.
      for (auto& [n, p] : e.module->named_parameters()) {
        out.emplace_back(e.name.empty() ? n : e.name + "." + n, p);
      }
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
