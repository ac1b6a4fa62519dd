// Recompute: activation recomputation (checkpointing) of a module (lib/nn/recompute.cpp). Its
// forward runs the wrapped module on a scratch Context that is dropped at once, keeping only the
// input; its backward runs the module's forward again from that input, then its backward. The
// activations the module saves live only during its own backward: memory for compute (one extra
// forward of the module, its collectives included).
//
// The wrapper is transparent: the module's parameters keep their names (no extra level), and the
// results, gradients included, are those of the module itself, bit for bit, as long as its forward
// is deterministic (no dropout draws that differ between the two runs). Weight-gradient deferral
// (zero-bubble schedules) carries over: what the module's backward defers is handed to the outer
// Context. The wrapped module must not read ctx.targets() (a loss).
#pragma once

#include <memory>

#include "quintet/nn/module.hpp"

namespace quintet::nn {

class Recompute : public Module {
 public:
  explicit Recompute(std::unique_ptr<Module> inner);
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  Module& inner() { return *inner_; }

 private:
  Module* inner_;
};

}  // namespace quintet::nn
