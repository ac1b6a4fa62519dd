#include "quintet/nn/module.hpp"

namespace quintet::nn {

Parameter& Module::add_parameter(const std::string& name, const Shape& shape, ParameterInit init,
                                 ParameterAttributes attrs) {
  auto p = std::make_unique<Parameter>(name, shape, init, std::move(attrs));
  Parameter& ref = *p;
  entries_.push_back(Entry{name, std::move(p), nullptr, nullptr});
  return ref;
}

Fp8TensorScale& Module::add_fp8_scale(const std::string& name, Fp8Format format,
                                      const Fp8Recipe& recipe) {
  auto s = std::make_unique<Fp8TensorScale>(format, recipe, name);
  Fp8TensorScale& ref = *s;
  entries_.push_back(Entry{name, nullptr, nullptr, std::move(s)});
  return ref;
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const Entry& e : entries_) {
    if (e.parameter) {
      out.emplace_back(e.name, e.parameter.get());
    } else if (e.module) {
      // A child under "" (a transparent wrapper such as Recompute) adds no level to the names.
      for (auto& [n, p] : e.module->named_parameters()) {
        out.emplace_back(e.name.empty() ? n : e.name + "." + n, p);
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, Fp8TensorScale*>> Module::named_fp8_scales() const {
  std::vector<std::pair<std::string, Fp8TensorScale*>> out;
  for (const Entry& e : entries_) {
    if (e.fp8) {
      out.emplace_back(e.name, e.fp8.get());
    } else if (e.module) {
      for (auto& [n, s] : e.module->named_fp8_scales()) {
        out.emplace_back(e.name.empty() ? n : e.name + "." + n, s);
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
