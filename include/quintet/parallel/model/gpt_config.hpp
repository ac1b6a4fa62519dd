// GptConfig: the one description of the library's transformer / GPT (parallel/model/), from which
// every trainer and test builds its model (gpt.hpp), whole or cut into pipeline chunks.
//
// A block is pre-norm: h = x + attention(norm1(x)); y = h + mlp(norm2(h)). Its attention slot and
// MLP slot are filled by configuration (`attention`, `mlp`), not by a block class per combination:
// today tensor-parallel attention and the tensor-parallel dense MLP; context-parallel attention
// and MoE plug into the same slots. Init: normal(0, init_std) for matrices and embeddings, the two
// output projections of each block normal(0, output_init_std()) (GPT-2), biases zero, norm gains
// one. Implemented by parallel/model/gpt_config.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/dtype.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/layer_kinds.hpp"
#include "quintet/parallel/context/ring_attention.hpp"
#include "quintet/parallel/expert/router.hpp"

namespace quintet::model {

// What fills a block's attention slot.
enum class AttentionKind {
  tensor_parallel,  // causal self-attention with heads split over tp (ParallelAttention)
};

// What fills a block's MLP slot.
enum class MlpKind {
  dense,  // the MLP split along its width over tp (ParallelMLP)
  moe,    // mixture of experts (expert::MoELayer) in the blocks GptConfig::is_moe_block picks
};

// The MoE MLPs of a model with mlp = MlpKind::moe (expert/moe_layer.hpp). Each MoE block's
// experts are MLPs of `activation` and width expert_ffn, spread over ep and split over etp.
struct MoEConfig {
  expert::RouterConfig router;  // experts, top_k, score, capacity, load balancing
  std::int64_t expert_ffn = 0;  // each expert's width; 0 = the dense MLP width (mlp_width())
  int shared_experts = 0;       // a dense MLP of shared_experts * expert_ffn every token takes
  int every = 1;                // block l is MoE when l % every == 0 (the others dense)
  // Blocks (global indices, ascending) that hold the dense MLP (GptConfig::mlp_width() wide)
  // although `every` picks them: DeepSeek's first k dense blocks are {0, .., k-1}, and with
  // every = 1 any pattern is a list (Qwen3-MoE's mlp_only_layers and decoder_sparse_step,
  // hf_checkpoint.hpp). Each must be a block `every` picks, and one MoE block at least remains.
  std::vector<std::int64_t> dense_layers;
  int overlap_chunks = 1;  // MoEOptions::overlap_chunks: exchange chunks overlapped with compute
};

// What each block recomputes in backward instead of keeping its activations (nn::Recompute): a
// trade of compute for memory that leaves the results, gradients included, unchanged.
enum class RecomputeKind {
  none,
  attention,  // the attention slot (qkv, attention, output projection); keeps its input
  full,       // the whole block; keeps only the block's input
};
// "none", "attention", "full"; InvalidArgument (listing them) for anything else.
RecomputeKind parse_recompute_kind(std::string_view name);

// A list of block indices as the flags and job files write it: "0,1,5" or with ranges "0-2,5"
// (ascending); "" is none. InvalidArgument, naming the text, for anything else (a negative or
// descending entry, a range whose end is below its start, a stray character).
std::vector<std::int64_t> parse_layer_list(std::string_view text);
// The list as parse_layer_list reads it back, each index once: "0,1,5" ("" for none).
std::string layer_list_text(const std::vector<std::int64_t>& layers);

// The model families GptConfig's named constructors build (and the trainers' --arch): each fixes
// the block's structure as the family's published models have it, not its sizes.
//   gpt2       LayerNorm, GELU MLP, learned absolute positions, biases (eps 1e-5)
//   llama      RMSNorm, SwiGLU MLP, RoPE (theta 500000, Llama 3), no biases (eps 1e-5)
//   qwen3      llama's, with QK-norm, RoPE theta 1000000, eps 1e-6
//   mixtral    llama's with RoPE theta 1000000; its MoE: 8 SwiGLU experts of the MLP's width
//              (expert_ffn 0: ffn_hidden), top-2
//   qwen3_moe  qwen3's; its MoE: 128 SwiGLU experts of width 3/8 of hidden (expert_ffn), top-8
// The MoE families route by a softmax over all experts, then renormalize the top k; dropless,
// no shared experts, no balancing bias, every block MoE (moe.every 1, no moe.dense_layers). The
// auxiliary and z-loss coefficients
// are the training's, not the family's.
enum class ModelFamily { gpt2, llama, qwen3, mixtral, qwen3_moe };
// "gpt2", "llama", "qwen3", "mixtral", "qwen3-moe"; InvalidArgument (listing them) otherwise.
ModelFamily parse_model_family(std::string_view name);
std::string_view model_family_name(ModelFamily family);
// Whether the family's MLPs are mixtures of experts (mixtral, qwen3_moe).
bool is_moe_family(ModelFamily family);

// "layernorm", "rmsnorm" and "gelu", "swiglu"; InvalidArgument (listing them) otherwise.
nn::NormKind parse_norm_kind(std::string_view name);
nn::Activation parse_activation(std::string_view name);

struct GptConfig {
  std::int64_t layers = 2;
  std::int64_t hidden = 128;    // model width d
  std::int64_t heads = 4;       // attention heads; head dim = hidden / heads unless head_dim
  std::int64_t kv_heads = 0;    // key/value heads (grouped-query attention, MQA at 1); 0 = heads
  std::int64_t head_dim = 0;    // 0 = hidden / heads
  std::int64_t ffn_hidden = 0;  // MLP width; 0 = 4 * hidden
  std::int64_t vocab = 256;
  std::int64_t seq_len = 128;  // longest sequence: the position table and the causal mask
  nn::NormKind norm = nn::NormKind::layernorm;
  nn::Activation activation = nn::Activation::gelu;  // GELU MLP has biases, SwiGLU none
  bool bias = true;                                  // biases of the attention projections
  bool proj_bias = true;  // with bias: the output projection's too (false: q, k, v only, Qwen2)
  bool tied_embeddings = false;   // the LM head reuses the token embedding's table
  bool learned_positions = true;  // a learned absolute position embedding after the tokens
  bool rope = false;              // rotary positions on q and k instead (learned_positions off)
  double rope_theta = 10000.0;    // RoPE's base
  nn::RopeScaling rope_scaling;   // Llama 3's frequency scaling (Llama 3.1 on), when factor > 0
  bool qk_norm = false;           // an RMSNorm (eps) over head_dim on each head's q and k
  float init_std = 0.02f;
  float proj_init_std = 0.0f;      // output projections; 0 = init_std / sqrt(2 * layers)
  float eps = 1e-5f;               // of the norms
  DType dtype = DType::f32;        // compute dtype of the parameters (give it to ParameterStore)
  bool sequence_parallel = false;  // activations between blocks are [B, S/tp, d]
  // > 1: the attention's and MLP's tp communication is cut into this many chunks along the
  // sequence, each overlapping a GEMM (tensor_parallel/linear.hpp); each rank's sequence
  // (seq_len / cp, and / tp with SP) must be a multiple. No effect at tp 1.
  int tp_overlap_chunks = 1;
  AttentionKind attention = AttentionKind::tensor_parallel;
  MlpKind mlp = MlpKind::dense;
  RecomputeKind recompute = RecomputeKind::none;
  // How attention spans the context-parallel ranks, when ModelGroups::cp has more than one: each
  // then holds 2 chunks of every sequence (context/ring_attention.hpp's layout).
  context::ContextParallelKind context_parallel = context::ContextParallelKind::ring;
  MoEConfig moe;  // used when mlp == MlpKind::moe
  // FP8 training (mode hybrid): every block's tp linear layers (attention projections, dense
  // MLP, MoE shared MLP) in FP8 (tensor_parallel/fp8.hpp): cuBLASLt's FP8 GEMMs on a GPU (bf16 or
  // f32), the exact emulation on the CPU (f32); the MoE experts' GEMMs too, with per-tensor
  // scales (expert/experts.hpp); no context parallelism (its sequence chunks would be scaled
  // apart); the LM head stays in the model's dtype unless fp8_lm_head.
  nn::Fp8Recipe fp8;
  // With fp8 on: the LM head (tied or not) in FP8 too, as the tp linear layers (its scaling
  // state "lm_head.fp8_x", "lm_head.fp8_w", "lm_head.fp8_dy"). Off by default: the logits' and
  // the loss gradient's range is where FP8 costs most accuracy.
  bool fp8_lm_head = false;
  // The family the structure came from (the named constructors, set_family, --arch): a label
  // the fields above override; validate() holds its MLP kind to mlp (gpt2 takes either).
  ModelFamily family = ModelFamily::gpt2;

  // A model of a family (ModelFamily): `base` with the family's structure set over it
  // (set_family), its sizes and layout settings kept, so a C++ user writes
  //   GptConfig::llama({.layers = 16, .hidden = 2048, .heads = 32, .kv_heads = 8,
  //                     .ffn_hidden = 8192, .vocab = 128256, .seq_len = 2048})
  // mixtral and qwen3_moe also make every MLP an MoE (mlp = MlpKind::moe) of their shape (at
  // ModelFamily, set by set_family); set moe after for another.
  static GptConfig gpt2(const GptConfig& base);
  static GptConfig gpt2();  // over GptConfig{}
  static GptConfig llama(const GptConfig& base);
  static GptConfig llama();  // over GptConfig{}
  static GptConfig qwen3(const GptConfig& base);
  static GptConfig qwen3();  // over GptConfig{}
  static GptConfig mixtral(const GptConfig& base);
  static GptConfig mixtral();  // over GptConfig{}
  static GptConfig qwen3_moe(const GptConfig& base);
  static GptConfig qwen3_moe();  // over GptConfig{}
  // Sets family and the structure the family fixes (the list at ModelFamily): norm, eps,
  // activation, learned_positions, rope, rope_theta, bias (proj_bias on), qk_norm, and for mixtral
  // and qwen3_moe the MoE shape in moe (router experts, top_k, score, renormalize, capacity_factor,
  // bias_rate; expert_ffn from hidden, shared_experts, every, dense_layers). Leaves the sizes, the
  // layout settings, the MLP kind (mlp) and, for the dense families, moe as they are.
  void set_family(ModelFamily f);

  // The key/value heads (kv_heads, or heads when 0) and the head dimension (head_dim, or
  // hidden / heads when 0).
  std::int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // The MLP width (ffn_hidden, or 4 * hidden when 0).
  std::int64_t mlp_width() const;
  // Whether block l (global index) holds an MoE MLP: mlp = moe, l % moe.every == 0 and l not in
  // moe.dense_layers. The other blocks of an MoE model hold the dense MLP of mlp_width().
  bool is_moe_block(std::int64_t l) const;
  // An expert's width (moe.expert_ffn, or mlp_width() when 0).
  std::int64_t expert_width() const;
  // The init std of the two output projections of each block.
  float output_init_std() const;
  // Throws InvalidArgument, naming the field and how to fix it, unless every size is positive,
  // hidden divides by heads (or head_dim is set), kv_heads divides heads, heads, vocab and the
  // MLP width divide by tp, kv_heads divides by tp or divides tp (then each key/value head is
  // replicated over tp / kv_heads ranks), and the model has exactly one kind of position
  // information (learned_positions or rope, whose head_dim is even). Called by every
  // builder before any layer is made, so a bad config fails before any communication. (With
  // sequence parallelism the sequence of each batch must divide by tp; the layers check it in
  // forward, before their collectives.)
  // With cp > 1: seq_len splits into 2 * cp chunks, the cp rank's 2 chunks split over tp with
  // sequence parallelism, and all-to-all attention's heads divide by tp x cp and each tp rank's
  // key/value heads split or repeat over cp (context::check_ulysses_heads).
  // With mlp = dense, moe must be left at its defaults (MoE settings on a dense model are
  // refused, naming them, rather than silently ignored). A dense family (llama, qwen3) with
  // mlp = moe, or an MoE family (mixtral, qwen3_moe) with mlp = dense, is refused naming both.
  void validate(int tp, int cp = 1) const;
  // The part of validate() a transformer block needs (everything but the vocabulary).
  void validate_block(int tp, int cp = 1) const;
  // With mlp = moe: the router config (RouterConfig::validate), moe.every >= 1, moe.dense_layers
  // ascending, each a block below `layers` that `every` makes MoE, at least one MoE block left,
  // the experts divisible by ep and the expert width by etp (InvalidArgument naming the
  // numbers). With mlp = dense: ep = 1 (an expert-parallel layout for a dense model is refused).
  void validate_experts(int ep, int etp) const;

  // Parameters of the whole, unsharded model (a tied table counted once), and the N of the
  // 6 N training FLOPs per token: every weight outside the token and position embeddings, with
  // the LM head counted even when tied (it is a real matmul).
  // With MoE, every expert counts in both; active_non_embedding_params() counts the top_k experts
  // a token runs (plus the router and the shared experts): the N of 6 N for MoE.
  std::int64_t total_params() const;
  std::int64_t non_embedding_params() const;
  std::int64_t active_non_embedding_params() const;
};

}  // namespace quintet::model
