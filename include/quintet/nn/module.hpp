// Module: a piece of a model with an explicit forward and backward (no autograd); the activations
// one microbatch saves between them live in a Context (context.hpp).
//
// forward(ctx, x) computes the output on ctx.stream() and saves what backward needs in ctx;
// backward(ctx, dy) takes those back, ACCUMULATES the parameters' gradients (+=), marks each
// parameter grad-ready, and returns dx. One Context per microbatch in flight, so a pipeline can
// interleave microbatches; calls for one microbatch must be nested (a module's backward runs
// after its forward and in reverse order of the forwards on the same Context).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/context.hpp"
#include "quintet/nn/parameter.hpp"

namespace quintet::nn {

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

 protected:
  // Declares a parameter owned by this module (memory comes from a ParameterStore).
  Parameter& add_parameter(const std::string& name, const Shape& shape, ParameterInit init,
                           ParameterAttributes attrs = {});
  // Adopts a child module under name; returns it. Under "" the child's parameters keep their own
  // names (a wrapper that adds no level).
  template <class M>
  M& add_module(const std::string& name, std::unique_ptr<M> child) {
    M& ref = *child;
    entries_.push_back(Entry{name, nullptr, std::move(child)});
    return ref;
  }

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Parameter> parameter;  // exactly one of the two is set
    std::unique_ptr<Module> module;
  };
  std::vector<Entry> entries_;
};

}  // namespace quintet::nn
