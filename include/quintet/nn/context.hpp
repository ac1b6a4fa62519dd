// Context: the activations one microbatch saved in its forward for its backward (see module.hpp),
// the stream that microbatch's ops run on, and its training targets for the loss at the end of a
// model. One Context per microbatch in flight.
#pragma once

#include <any>
#include <functional>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn {

class Module;

// The saved activations of one microbatch. Borrows the stream, which must outlive it.
class Context {
 public:
  explicit Context(const Stream& stream) : stream_(&stream) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  Context(Context&&) = default;
  Context& operator=(Context&&) = default;

  const Stream& stream() const { return *stream_; }
  // Saves tensors for module's backward (a stack per module: a module called twice in one
  // forward gets its saves back last-in, first-out); nothing on a forward-only context.
  void save(const Module& module, std::vector<Tensor> tensors);
  // Takes back the most recent save of module; throws InvalidArgument when there is none
  // (backward without a forward on this context).
  std::vector<Tensor> take(const Module& module);
  // The same for a typed handle (a struct of named tensors and values): saved on the same stack
  // (nothing on a forward-only context), taken back as the type it was saved as (InvalidArgument
  // for another).
  template <class T>
  void save_handle(const Module& module, T handle) {
    push(module, std::any(std::move(handle)));
  }
  template <class T>
  T take_handle(const Module& module) {
    std::any saved = pop(module);
    T* handle = std::any_cast<T>(&saved);
    if (handle == nullptr) wrong_type(saved, typeid(T));
    return std::move(*handle);
  }
  // Number of saves not yet taken (0 after a full backward).
  std::size_t pending() const;
  void clear() { saved_.clear(); }

  // The targets of this microbatch (e.g. next-token ids [B, S]) for the loss module at the end of
  // a model (the last pipeline chunk's), and the factor the gradient of that loss is scaled by
  // (1/m for m accumulated microbatches): the loss's backward starts from d(loss) = loss_scale.
  void set_targets(Tensor targets, float loss_scale = 1.0f);
  // Throws InvalidArgument when set_targets was not called on this context.
  const Tensor& targets() const;
  float loss_scale() const { return loss_scale_; }
  // The factor alone, for a context whose chunk has no loss but whose layers add terms of their
  // own to it (an MoE layer's load-balancing losses): every pipeline stage's contexts get it.
  void set_loss_scale(float loss_scale) { loss_scale_ = loss_scale; }
  // Whether this forward is a recomputation in backward (nn::Recompute): the values are those of
  // the first forward, and per-step statistics must not count it again.
  void set_recomputing(bool on) { recomputing_ = on; }
  bool recomputing() const { return recomputing_; }
  // Whether this forward is an evaluation with no backward to follow (train::evaluate): save()
  // keeps nothing, and per-step statistics must not count it.
  void set_forward_only(bool on) { forward_only_ = on; }
  bool forward_only() const { return forward_only_; }
  // Whether a layer's per-step statistics (an MoE layer's expert load, aux and z losses) count
  // this forward: neither a recomputation nor an evaluation.
  bool counts_statistics() const { return !recomputing_ && !forward_only_; }

  // Weight-gradient deferral, for zero-bubble schedules that split a backward into its
  // input-gradient part (I, now) and its weight-gradient part (W, later): while on, every
  // deferrable nn::accumulate_gradients of a backward on this context is queued here
  // (parameter.hpp) instead of run; run_deferred_gradients() runs the queue in order and empties
  // it.
  void set_defer_weight_gradients(bool on) { defer_ = on; }
  bool defers_weight_gradients() const { return defer_; }
  void defer(std::function<void()> work) { deferred_.push_back(std::move(work)); }
  void run_deferred_gradients();
  // Appends this context's deferred work to other's queue, in order, and empties this one (a
  // scratch context's, nn::Recompute).
  void move_deferred_to(Context& other);
  std::size_t deferred_count() const { return deferred_.size(); }

 private:
  const Stream* stream_;
  Tensor targets_;
  float loss_scale_ = 1.0f;
  bool defer_ = false;
  bool recomputing_ = false;
  bool forward_only_ = false;
  std::vector<std::function<void()>> deferred_;
  std::unordered_map<const Module*, std::vector<std::any>> saved_;

  void push(const Module& module, std::any saved);
  std::any pop(const Module& module);
  [[noreturn]] static void wrong_type(const std::any& saved, const std::type_info& wanted);
};

}  // namespace quintet::nn
