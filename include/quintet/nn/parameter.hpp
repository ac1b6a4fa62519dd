// Parameter: one named weight of a model, with its f32 gradient and the attributes that let data
// parallelism, the optimizer and checkpoints act on it without knowing the layer; and
// ParameterStore: the flat buffers that hold all parameters of one model chunk (values in one,
// gradients in another), laid out in backward order so buckets and ZeRO shards are contiguous.
//
// Lifecycle: a Module declares its parameters (shape, init, attributes) when constructed; they
// have no memory yet. A ParameterStore built over the root module then names them
// ("block0.attn.qkv.weight"), allocates both buffers on one device, points every Parameter's
// data() and grad() at its slice, and initialises the values. Not thread-safe.
//
// Lazy zeroing: ParameterStore::zero_grad fills nothing; it marks every gradient stale, and a
// stale gradient reads as zeros: every way to get it (grad(), grad_for_backward, the store's
// grad_buffer() and grad_range()) fills it with zeros first. The one exception is
// grad_for_write, for a backward product that writes every element (a linear layer's
// weight-gradient GEMM): the step's first such contribution overwrites the gradient (beta = 0)
// instead of adding to zeros, so most of the flat buffer is neither zeroed nor read back.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "quintet/core/axis.hpp"
#include "quintet/core/random.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn {

class Module;
class Context;
class ParameterStore;

// A weight held twice, by two model chunks that both use it (a token embedding tied to the LM
// head, with the embedding on the first pipeline stage and the head on the last): the owner and
// the copy start equal (one name, so one init draw), their gradients are summed after each step's
// data-parallel reduction (pipeline::PipelineExecutor does it), so they stay equal. Data
// parallelism gives such a weight a bucket of its own, so that the two copies' ZeRO shards cover
// the same elements; the gradient norm counts the owner only.
enum class TiedRole { none, owner, copy };

// How a parameter's values are first drawn.
struct ParameterInit {
  enum class Kind { normal, zeros, ones };
  Kind kind = Kind::normal;
  float stddev = 0.02f;  // for normal (mean 0)
  static ParameterInit normal(float stddev) { return {Kind::normal, stddev}; }
  static ParameterInit zeros() { return {Kind::zeros, 0.0f}; }
  static ParameterInit ones() { return {Kind::ones, 0.0f}; }
};

struct ParameterAttributes {
  int shard_dim = -1;              // the dimension split across ranks, -1 for none
  std::optional<Axis> shard_axis;  // the axis it is split over (none when not a shard)
  bool is_expert = false;          // an expert's weight (reduced over edp, not dp)
  bool reduce_over_tp = false;     // grad must be all-reduced over tp (sequence-parallel norms)
  bool weight_decay = true;        // AdamW applies weight decay (false for norms and biases)
  TiedRole tied = TiedRole::none;  // one of two copies of a weight tied across chunks
  // When this parameter is a shard: the unsharded shape and where the shard starts in it. The
  // random init draws exactly that slice of the unsharded draw. Empty = not a shard.
  Shape full_shape;
  Shape shard_start;
  // A tp shard held whole by this many consecutive tp ranks (key/value heads replicated when
  // kv_heads < tp): the same box, the same values and, summed by the layer, the same gradient on
  // each. The first of them (tp rank % tp_replicas == 0) counts it in the gradient norm and writes
  // it to checkpoints.
  int tp_replicas = 1;
};

class Parameter {
 public:
  Parameter(std::string local_name, Shape shape, ParameterInit init, ParameterAttributes attrs);

  // The full dotted name, set by the ParameterStore (the local name before that).
  const std::string& name() const { return name_; }
  const std::string& local_name() const { return local_name_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_numel(shape_); }
  const ParameterInit& init() const { return init_; }
  const ParameterAttributes& attributes() const { return attrs_; }
  // Marks this parameter as one copy of a weight tied across chunks (TiedRole), before a store
  // has materialised it (InvalidArgument after).
  void set_tied(TiedRole role);

  // The values (compute dtype) and the gradient (accum_dtype: f32, f64 for f64 values): handles
  // to views into the store's flat buffers (writing through them writes the buffers). Throw
  // InvalidArgument before a store has materialised the parameter.
  Tensor data() const;
  // grad() of a stale gradient zeroes it first, on the stream zero_grad was given (and, on a GPU,
  // waits for that fill: grad() has no stream to order it on).
  Tensor grad() const;
  bool materialized() const { return data_.defined(); }
  // The gradient a backward accumulates into on stream: grad(), after the store's gradient binder
  // has bound it when the store keeps gradients on demand (ZeRO-2, see
  // ParameterStore::release_gradient_buffer). Layers call this in backward, before
  // mark_grad_ready(); the binder throws InvalidArgument for a gradient asked for after its bucket
  // was already reduced.
  // A stale gradient (see lazy zeroing above) is zeroed on stream first.
  Tensor grad_for_backward(const Stream& stream);
  // grad_for_backward for a backward that writes EVERY element of the gradient in one product
  // (a linear layer's weight-gradient GEMM): overwrite is true when the gradient was stale (the
  // first contribution of the step: nothing filled it; it is no longer stale), and the product
  // must then overwrite it (beta = 0) rather than add to it; else it adds, as grad_for_backward.
  struct GradForWrite {
    Tensor grad;
    bool overwrite = false;
  };
  GradForWrite grad_for_write(const Stream& stream);
  // Whether the gradient is stale: zero_grad declared it zero and nothing has filled or written
  // it since (its memory holds an earlier step's values; every accessor zeroes it first).
  bool grad_stale() const { return grad_stale_; }
  // Whether grad() has storage now (always, unless the store keeps gradients on demand).
  bool grad_bound() const { return grad_.defined(); }
  // data(), for a forward about to read it on stream: first runs the store's before-use hook
  // (the ZeRO optimizer uses it to make stream wait for the all-gather that refreshes these
  // values), so a module's forward waits only for the parameters it is about to use. Layers call
  // this in forward; backward may call data() (the forward already waited).
  Tensor use(const Stream& stream);
  // Offset of this parameter in the store's buffers, in elements.
  std::int64_t offset() const { return offset_; }

  // Called by a module's backward once this parameter's gradient for the current microbatch is
  // complete; runs the store's grad-ready hooks (data parallelism subscribes to them).
  void mark_grad_ready();

 private:
  friend class ParameterStore;
  std::string local_name_;
  std::string name_;
  Shape shape_;
  ParameterInit init_;
  ParameterAttributes attrs_;
  Tensor data_;
  Tensor grad_;
  ParameterStore* store_ = nullptr;
  mutable bool grad_stale_ = false;  // see lazy zeroing above; zeroed by store_ on access
  std::int64_t offset_ = -1;
  std::function<void(Parameter&)> on_grad_ready_;
  std::function<void(Parameter&, const Stream&)> on_use_;
  std::function<void(Parameter&, const Stream&)> on_grad_needed_;
};

// The gradient protocol of a layer's backward, in one place, so that a new layer cannot get it
// wrong: binds the gradient of each parameter (Parameter::grad_for_backward, which with gradients
// on demand may allocate it), calls accumulate(grads, stream) with them in the order given (an
// undefined tensor for a null parameter, e.g. an absent bias), which must ADD this microbatch's
// contribution into them on stream, then marks each non-null parameter grad-ready in the order
// given. Every layer's backward goes through it.
//
// GradTiming says whether the work may run later. Zero-bubble pipeline schedules split a backward
// into its input-gradient part (I) and its weight-gradient part (W): while
// ctx.defers_weight_gradients(), deferrable work is queued on ctx and runs, binding and marking
// included, at ctx.run_deferred_gradients(). Deferrable work must therefore hold what it reads by
// value (tensors are shared handles), not by reference to the backward's locals. A fused kernel
// that computes dx together with the weight gradient (the norms) is GradTiming::now: it runs at
// once, but while deferring its parameters are marked ready at W too, so that all the marks of a
// (stage, microbatch) backward happen at its W.
//
// GradReady::defer leaves the parameters unmarked: for a weight shared by two layers (a tied LM
// head reusing the embedding's table), the layer whose backward runs first defers, and the owner's
// backward, which runs last, marks it. A parameter must be marked exactly once per microbatch.
//
// The overload taking an OverwritingGradientWork gets the first parameter's gradient with
// Parameter::grad_for_write, and tells the work whether it must OVERWRITE grads[0] (the step's
// first contribution to a stale gradient) instead of adding to it; its work must write every
// element of grads[0] (a weight-gradient GEMM with beta = 0 when overwrite). The other gradients
// are accumulated as above. The overload taking an OverwritingGradientsWork does the same for
// EVERY gradient: overwrite[i] says whether grads[i] is stale and must be overwritten (false for
// an undefined one), and its work must then write every element of it (the MoE experts' grouped
// weight-gradient GEMMs, an expert without rows zero-filled).
enum class GradTiming { deferrable, now };
enum class GradReady { mark, defer };
using GradientWork = std::function<void(const std::vector<Tensor>& grads, const Stream& stream)>;
using OverwritingGradientWork =
    std::function<void(const std::vector<Tensor>& grads, bool overwrite, const Stream& stream)>;
void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          GradientWork accumulate, GradTiming timing,
                          GradReady ready = GradReady::mark);
void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          OverwritingGradientWork accumulate, GradTiming timing,
                          GradReady ready = GradReady::mark);
using OverwritingGradientsWork = std::function<void(
    const std::vector<Tensor>& grads, const std::vector<bool>& overwrite, const Stream& stream)>;
void accumulate_gradients(Context& ctx, std::initializer_list<Parameter*> params,
                          OverwritingGradientsWork accumulate, GradTiming timing,
                          GradReady ready = GradReady::mark);

// Owns the value and gradient buffers of every parameter of a module tree. Parameters are laid
// out in backward order (the reverse of the modules' registration order), each aligned to
// kAlignElements. Init draws come from Philox(seed, stream_id = hash of the parameter's name), so
// they do not depend on the layout, the device or the other parameters.
class ParameterStore {
 public:
  static constexpr std::int64_t kAlignElements = 64;

  // Names, allocates (on stream's device) and initialises every parameter of root. dtype is the
  // compute dtype (f32 or bf16 on a GPU; f32 or f64 on the CPU). Gradients start at zero.
  ParameterStore(Module& root, DType dtype, const Stream& stream, std::uint64_t seed);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // The parameters in backward order (= buffer order).
  const std::vector<Parameter*>& parameters() const { return params_; }
  // The flat buffers ([total elements], including alignment padding, which stays zero). The
  // gradient buffer is undefined once release_gradient_buffer() has run. grad_buffer() first
  // zeroes every stale gradient (as Parameter::grad() does: on zero_grad's stream, waited for on
  // a GPU; nothing when none is stale).
  const Tensor& data_buffer() const { return data_; }
  const Tensor& grad_buffer() const;
  // The gradient buffer's elements [begin, begin + n), after zeroing on stream every stale
  // gradient of a parameter that overlaps them (one fill per run of consecutive stale ones),
  // and none outside: what a reader of part of the buffer (a bucket's reduction, a ZeRO shard)
  // uses while backward may still be writing other gradients.
  Tensor grad_range(std::int64_t begin, std::int64_t n, const Stream& stream);
  // Elements of the flat buffers (values and, while it exists, gradients).
  std::int64_t total_elements() const { return data_.numel(); }
  DType dtype() const { return data_.dtype(); }
  const Device& device() const { return data_.device(); }
  // The parameter of that full name; throws InvalidArgument listing none if absent.
  Parameter& find(const std::string& name) const;

  // Zeroes every gradient on stream (with gradients on demand: every bound one). Lazily, for the
  // flat buffer: marks every gradient stale (see lazy zeroing at the top), to be zeroed on its
  // first access or overwritten by its first grad_for_write contribution; stream is remembered
  // for grad() and grad_buffer(), so it must outlive the step.
  void zero_grad(const Stream& stream);
  // Lazy zeroing on (the default) or off (zero_grad fills the whole buffer at once, and no
  // gradient is ever stale or overwritten): a switch for the test that compares the two
  // (tests/unit/nn_lazy_zero_grad_test.cpp), not a tuning knob.
  void set_lazy_zero_grad(bool on) { lazy_ = on; }
  // Gradients on demand (ZeRO-2): frees the flat gradient buffer and unbinds every gradient.
  // From then on a gradient has storage only while bind_gradients has bound it; grad() throws
  // InvalidArgument otherwise, and Parameter::grad_for_backward calls binder (on the backward's
  // thread, with its stream), which must bind it. Irreversible for this store.
  void release_gradient_buffer(std::function<void(Parameter&, const Stream&)> binder);
  bool gradients_on_demand() const { return on_demand_; }
  // Points the gradients of params at views of storage (1-D, accum dtype, on the store's device),
  // where storage element i stands for flat element `first + i`; every parameter must lie inside.
  void bind_gradients(const std::vector<Parameter*>& params, const Tensor& storage,
                      std::int64_t first);
  // Takes the gradient storage of params away (grad() throws until bound again).
  void unbind_gradients(const std::vector<Parameter*>& params);
  // Adds a hook run (on the calling thread) each time a parameter is marked grad-ready.
  void add_grad_ready_hook(std::function<void(Parameter&)> hook);
  // Sets the hook Parameter::use runs (one at a time; an empty function removes it). It is
  // called on the thread running the forward, with the forward's stream.
  void set_before_use_hook(std::function<void(Parameter&, const Stream&)> hook);
  // Set by DataParallel: the gradients are reduced across ranks (and, under ZeRO, sharded), so
  // only a distributed optimizer may step this store (the tests' single-rank nn::AdamW refuses it).
  void mark_data_parallel() { data_parallel_ = true; }
  bool data_parallel() const { return data_parallel_; }

 private:
  std::vector<Parameter*> params_;
  Tensor data_;
  Tensor grad_;
  std::vector<std::function<void(Parameter&)>> hooks_;
  std::function<void(Parameter&, const Stream&)> use_hook_;
  std::function<void(Parameter&, const Stream&)> grad_binder_;
  bool on_demand_ = false;
  bool data_parallel_ = false;
  // Lazy zeroing: whether it is on, how many gradients are stale, and zero_grad's stream.
  friend class Parameter;
  void zero_stale(const Parameter& p, const Stream& stream) const;
  void zero_stale(std::int64_t begin, std::int64_t end, const Stream& stream) const;
  Stream zero_grad_stream() const;
  void clear_stale(const Parameter& p) const;
  bool lazy_ = true;
  mutable std::size_t stale_ = 0;
  cudaStream_t zero_handle_ = nullptr;
};

// 64-bit FNV-1a of a name: the Philox stream id of a parameter's init.
std::uint64_t parameter_stream_id(const std::string& name);

}  // namespace quintet::nn
