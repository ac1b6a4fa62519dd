// Tensor-parallel causal self-attention (parallel/tensor_parallel/attention.cpp): the attention of
// a transformer block split by heads over tp. Conventions (activations, streams, parameters):
// regions.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/context/ring_attention.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"

namespace quintet::tensor_parallel {

struct ParallelAttentionOptions {
  bool bias = true;                // of the qkv and output projections
  bool proj_bias = true;           // with bias: the output projection's too (Qwen2: q, k, v only)
  float init_std = 0.02f;          // qkv
  float proj_init_std = 0.02f;     // the output projection (GPT-2: init_std / sqrt(2 * layers))
  bool sequence_parallel = false;  // x and the output are [B, S/tp, dim]
  int overlap_chunks = 1;  // of the qkv and output projections' tp communication (linear.hpp)
  // Context parallelism: with a cp communicator of more than one rank, x holds this cp rank's
  // chunks of the sequence (context/ring_attention.hpp's layout) and the attention spans the cp
  // ranks as cp_kind says.
  Communicator* cp = nullptr;
  context::ContextParallelKind cp_kind = context::ContextParallelKind::ring;
  // Grouped-query attention: kv_heads key/value heads (0: as many as query heads), each serving
  // heads / kv_heads query heads (MQA at 1). kv_heads must divide heads, and each tp rank holds
  // the key/value heads its query heads read: kv_heads / tp of them when tp divides kv_heads;
  // when kv_heads < tp (tp a multiple of kv_heads), one head, replicated over the tp / kv_heads
  // consecutive tp ranks whose query heads use it (see the class comment). Other pairs are
  // refused. With context parallelism: ring attention passes the fewer K/V heads around the
  // ring; all-to-all splits them over cp with the query heads (ring_attention.hpp).
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;  // 0: dim / heads
  // QK-norm (Qwen3): an RMSNorm over head_dim of each head's q and of each head's k, one weight
  // [head_dim] for each ("q_norm.weight", "k_norm.weight", replicated over tp, their gradients
  // partial sums over tp: reduce_over_tp), applied before RoPE.
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  // Rotary positions (nn::rope_forward_) on q and k, with the token's position in its sequence:
  // under context parallelism the positions of this cp rank's chunks (context::cp_positions).
  bool rope = false;
  double rope_theta = 10000.0;
  nn::RopeScaling rope_scaling;  // Llama 3's frequency scaling, when its factor > 0
  // mode hybrid: the projections (qkv or q and kv, and the output's) in FP8 (linear.hpp); the
  // attention itself stays in the compute dtype.
  nn::Fp8Recipe fp8{};
};

// Causal self-attention with heads split over tp. With as many key/value heads as query heads: qkv
// = ColumnParallelLinear with 3 fused parts (parameters "qkv.weight" [3, A/tp, dim], "qkv.bias"
// [3, A/tp], A = heads * head_dim); with fewer (grouped-query): q = ColumnParallelLinear
// ("q.weight" [A/tp, dim]) and kv = ColumnParallelLinear with 2 fused parts ("kv.weight"
// [2, kv_heads * head_dim / tp, dim]) sharing one entry into the tp region. heads/tp local query
// heads, kv_heads/tp local key/value heads, proj = RowParallelLinear (A/tp -> dim).
// x [B, S(/tp), dim] -> same shape.
// Key/value heads replicated (kv_heads < tp): tp rank r holds key/value head r / (tp / kv_heads)
// ("kv.weight" [2, head_dim, dim], its box in the global [2, kv_heads * head_dim, dim] declared by
// full_shape and shard_start, tp_replicas = tp / kv_heads). Its replicas start equal (the same
// slice of the init draw) and stay equal: backward sums their output gradients over the ranks
// that share the head (one all-reduce over tp of a [tp / replicas, B·S·2·head_dim] buffer, each
// group's sum in its slot), so each holds the whole weight gradient, and the first replica alone
// adds its input gradient. Checkpoints write the box once (its first replica) and fill every
// replica on restore; the gradient norm counts it once.
class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(Communicator& tp, std::int64_t dim, std::int64_t heads,
                    std::int64_t max_seq_len, const ParallelAttentionOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  // q, k, v of one forward as [B, S, heads, head_dim] (views or tensors).
  struct Heads {
    Tensor q, k, v;
  };
  bool grouped() const { return qkv_ == nullptr; }
  // The global positions of this rank's tokens (undefined: 0 .. seq - 1), on x's device.
  Tensor positions(std::int64_t seq, const Tensor& x, const Stream& stream) const;
  // The key/value output gradient summed over the tp ranks that share this rank's heads.
  Tensor sum_over_replicas(const Tensor& dkv, const Stream& stream) const;

  Communicator* tp_;
  std::int64_t tp_size_, dim_, local_heads_, local_kv_heads_, head_dim_, max_seq_len_;
  int kv_replicas_ = 1;  // tp ranks holding each key/value head (> 1 when kv_heads < tp)
  bool sp_;
  Communicator* cp_;  // null or one rank: no context parallelism
  context::ContextParallelKind cp_kind_;
  nn::RopeOptions rope_;
  bool use_rope_;
  ColumnParallelLinear* qkv_ = nullptr;  // as many key/value heads as query heads
  ColumnParallelLinear* q_ = nullptr;    // grouped-query attention: q, and k and v fused
  ColumnParallelLinear* kv_ = nullptr;
  nn::Module* q_norm_ = nullptr;  // QK-norm
  nn::Module* k_norm_ = nullptr;
  RowParallelLinear* proj_;
};

}  // namespace quintet::tensor_parallel
