// The single-rank layers of a GPT-style transformer, made of the ops of quintet/nn/ops.hpp:
// Linear, LayerNorm, RMSNorm, MLP (GELU or SwiGLU), causal self-attention, Embedding and a
// pre-norm transformer block. Test support, not library: the tests build them as the unsharded
// reference the parallel layers (parallel/tensor_parallel, parallel/model) must equal, and to
// exercise the nn ops, modules and gradient protocol through a small model. Sources: nn_layers.cpp,
// nn_attention_layer.cpp.
//
// Shapes: activations are [batch, seq, dim] (Linear, norms and MLP accept any [..., dim]).
// Parameters are declared at construction and get memory from a ParameterStore (parameter.hpp);
// every forward/backward runs on ctx.stream(). Weight init: normal(0, init_std) for matrices
// (output projections scaled by 1/sqrt(2 * layers), as GPT-2 does, when the caller passes it),
// zeros for biases, ones for norm gains.
#pragma once

#include <cstdint>
#include <memory>

#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn {

struct LinearOptions {
  bool bias = true;
  float init_std = 0.02f;
};

// y = x · Wᵀ + b. weight [out, in], bias [out].
class Linear : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, const LinearOptions& options = {});
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

 private:
  std::int64_t in_, out_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
};

// LayerNorm over the last dim: weight (gain) [dim], bias [dim].
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, float eps = 1e-5f);
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  Parameter* weight_;
  Parameter* bias_;
};

// RMSNorm over the last dim: weight (gain) [dim].
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::int64_t dim, float eps = 1e-5f);
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  Parameter* weight_;
};

// GELU: fc (dim -> hidden) -> gelu -> proj (hidden -> dim), with biases.
// SwiGLU: gate, up (dim -> hidden, no bias) -> silu(gate) * up -> proj (hidden -> dim, no bias).
class MLP : public Module {
 public:
  MLP(std::int64_t dim, std::int64_t hidden, Activation activation, float init_std = 0.02f,
      float proj_init_std = 0.02f);
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;

 private:
  Activation activation_;
  Linear* fc_;            // gelu: fc; swiglu: gate
  Linear* up_ = nullptr;  // swiglu only
  Linear* proj_;
};

// Multi-head causal self-attention on x [batch, seq, dim]: qkv = x · W_qkvᵀ (+ b), split into
// heads, causal attention, heads merged, output projection. seq must be <= max_seq_len.
struct AttentionLayerOptions {
  bool bias = true;             // of the qkv and output projections
  float init_std = 0.02f;       // qkv
  float proj_init_std = 0.02f;  // the output projection
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(std::int64_t dim, std::int64_t heads, std::int64_t max_seq_len,
                      const AttentionLayerOptions& options = {});
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;

 private:
  std::int64_t dim_, heads_, max_seq_len_;
  Linear* qkv_;
  Linear* proj_;
};

// Token embedding: ids [...] (i32/i64) -> [..., dim]; weight [vocab, dim]. backward returns an
// undefined tensor (ids have no gradient). With max_len > 0 (position embeddings), the last dim
// of the ids must not exceed it.
class Embedding : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t dim, float init_std = 0.02f, std::int64_t max_len = 0);
  Tensor forward(Context& ctx, const Tensor& ids) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  Parameter& weight() { return *weight_; }

 private:
  std::int64_t vocab_, max_len_;
  Parameter* weight_;
};

struct TransformerBlockConfig {
  std::int64_t dim = 64;
  std::int64_t heads = 4;
  std::int64_t hidden = 256;  // MLP hidden size
  std::int64_t max_seq_len = 1024;
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu;
  bool bias = true;  // biases of the attention projections
  float init_std = 0.02f;
  float proj_init_std = 0.02f;  // output projections (GPT-2: 0.02 / sqrt(2 * layers))
  float eps = 1e-5f;
};

// Pre-norm block: h = x + attn(norm1(x)); y = h + mlp(norm2(h)).
class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockConfig& config);
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;

 private:
  Module* norm1_;
  CausalSelfAttention* attn_;
  Module* norm2_;
  MLP* mlp_;
};

}  // namespace quintet::nn
