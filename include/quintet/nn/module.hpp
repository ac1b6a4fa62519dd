// Module: a piece of a model with an explicit forward and backward (no autograd); the activations
// one microbatch saves between them live in a Context (context.hpp).
//
// forward(ctx, x) computes the output on ctx.stream() and saves what backward needs in ctx;
// backward(ctx, dy) takes those back, ACCUMULATES the parameters' gradients (+=), marks each
// parameter grad-ready, and returns dx. One Context per microbatch in flight, so a pipeline can
// interleave microbatches; calls for one microbatch must be nested (a module's backward runs
// after its forward and in reverse order of the forwards on the same Context).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/context.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/parameter.hpp"

namespace quintet::nn {

// Declares a parameter on a module (Module::add_parameter), for the parts a module composes that
// are not modules of their own (an MoE layer's router and experts): their parameters keep the
// module's names and registration order.
using AddParameter = std::function<Parameter&(const std::string& name, const Shape& shape,
                                              ParameterInit init, ParameterAttributes attrs)>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(Context& ctx, const Tensor& x) = 0;
  virtual Tensor backward(Context& ctx, const Tensor& dy) = 0;

  // Every parameter of this module and its children, with dotted names relative to this module
  // ("attn.qkv.weight"), in registration (forward) order.
  std::vector<std::pair<std::string, Parameter*>> named_parameters() const;
  std::vector<Parameter*> parameters() const;
  // The FP8 scaling state of this module and its children (FP8 layers, fp8.hpp), dotted names as
  // named_parameters' ("blocks.0.mlp.fc.fp8_x"), in registration order; empty without FP8.
  std::vector<std::pair<std::string, Fp8TensorScale*>> named_fp8_scales() const;

 protected:
  // Declares a parameter owned by this module (memory comes from a ParameterStore).
  Parameter& add_parameter(const std::string& name, const Shape& shape, ParameterInit init,
                           ParameterAttributes attrs = {});
  // Declares the FP8 scaling state of one of this module's tensor roles.
  Fp8TensorScale& add_fp8_scale(const std::string& name, Fp8Format format, const Fp8Recipe& recipe);
  // add_parameter of this module, for such parts (valid while the module lives).
  AddParameter parameter_adder() {
    return [this](const std::string& name, const Shape& shape, ParameterInit init,
                  ParameterAttributes attrs) -> Parameter& {
      return add_parameter(name, shape, std::move(init), std::move(attrs));
    };
  }
  // Adopts a child module under name; returns it. Under "" the child's parameters keep their own
  // names (a wrapper that adds no level).
  template <class M>
  M& add_module(const std::string& name, std::unique_ptr<M> child) {
    M& ref = *child;
    entries_.push_back(Entry{name, nullptr, std::move(child), nullptr});
    return ref;
  }

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Parameter> parameter;  // exactly one of the three is set
    std::unique_ptr<Module> module;
    std::unique_ptr<Fp8TensorScale> fp8;
  };
  std::vector<Entry> entries_;
};

}  // namespace quintet::nn
