// The one mapping between Quintet's parameters and a Hugging Face checkpoint's tensors
// (parallel/train/hf_names.cpp), for import (hf_checkpoint.hpp) and export alike: each of our
// global parameters (its name and global shape, as Parameter::name() and
// ParameterAttributes::full_shape give them) is cut into boxes, each box equal to a box of one
// Hugging Face tensor (Llama, Qwen2, Qwen3, Mixtral, Qwen3-MoE). Import reads each box a rank holds
// from its tensor; export writes each tensor from the boxes that make it up. The boxes of a
// parameter tile it exactly.
//
//   ours (GptChunk names)                  Hugging Face (model.layers.N. omitted below)
//   wte.weight [V, d]                      model.embed_tokens.weight
//   lm_head.weight [V, d]                  lm_head.weight (absent when tie_word_embeddings)
//   norm.weight [d]                        model.norm.weight
//   blockN.norm1.weight / norm2.weight     input_layernorm.weight / post_attention_layernorm.weight
//   blockN.attn.qkv.weight [3, H*D, d]     self_attn.{q,k,v}_proj.weight [H*D, d] (kv_heads =
//   heads) blockN.attn.q.weight [H*D, d]          self_attn.q_proj.weight (grouped-query attention)
//   blockN.attn.kv.weight [2, K*D, d]      self_attn.{k,v}_proj.weight [K*D, d]
//   blockN.attn.{qkv,q,kv}.bias            self_attn.{q,k,v}_proj.bias, fused the same way
//   blockN.attn.proj.weight / bias         self_attn.o_proj.weight [d, H*D] / bias
//   blockN.attn.q_norm / k_norm.weight     self_attn.q_norm / k_norm.weight [D]
//   blockN.mlp.fc / up / proj.weight       mlp.gate_proj / up_proj / down_proj.weight
//   blockN.mlp.router.weight [E, d]        <moe>.gate.weight
//   blockN.mlp.experts.fc.weight [E, F, d] <moe>.experts.e.{w1 | gate_proj}.weight [F, d] per e,
//                                          or rows [0, F) of <moe>.experts.gate_up_proj [E, 2F, d]
//   blockN.mlp.experts.up.weight [E, F, d] <moe>.experts.e.{w3 | up_proj}.weight, or rows [F, 2F)
//                                          of <moe>.experts.gate_up_proj
//   blockN.mlp.experts.proj.weight [E,d,F] <moe>.experts.e.{w2 | down_proj}.weight [d, F] per e,
//                                          or <moe>.experts.down_proj [E, d, F]
// where <moe> is block_sparse_moe (Mixtral as transformers 4 writes it) or mlp (Qwen3-MoE, and
// Mixtral from transformers 5), expert names w1/w3/w2 are Mixtral's and gate/up/down_proj
// Qwen3-MoE's, and the fused 3-D expert tensors are transformers 5's. A second copy of a tied
// table (nn::TiedRole::copy, named wte.weight too) maps to the embedding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "quintet/parallel/model/gpt_config.hpp"

namespace quintet::train {

// How a checkpoint names what the model config does not fix.
struct HfNaming {
  // The MoE blocks' module: "block_sparse_moe" (Mixtral, transformers 4) or "mlp".
  std::string moe_module = "mlp";
  // The experts' weights: {"w1", "w3", "w2"} (Mixtral) or {"gate_proj", "up_proj", "down_proj"}.
  std::string expert_gate = "gate_proj", expert_up = "up_proj", expert_down = "down_proj";
  // transformers 5's fused 3-D expert tensors (experts.gate_up_proj, experts.down_proj) instead
  // of one 2-D tensor per expert and projection.
  bool fused_experts = false;
};

// The names every transformers version loads for a family: Mixtral's block_sparse_moe with w1,
// w3, w2; Qwen3-MoE's mlp with gate_proj, up_proj, down_proj; one 2-D tensor per expert.
HfNaming hf_naming(model::ModelFamily family);

// One box of our global parameter that is one box of a Hugging Face tensor, of equal sizes.
// When hf_shape has one dimension fewer than ours, our leading dimension is a stack of Hugging
// Face tensors: the box has size 1 there and our dimensions 1.. are the tensor's 0.. .
struct HfPiece {
  std::string hf_name;
  Shape hf_shape;  // the whole Hugging Face tensor
  Shape start;     // the box in our global parameter
  Shape sizes;
  Shape hf_start;  // where it begins in the Hugging Face tensor
};

// Our global shape of `name` and its pieces. Throws InvalidArgument naming the parameter for a
// name this model does not have (a LayerNorm bias, a learned position table, shared experts:
// nothing Hugging Face's Llama, Qwen3, Mixtral and Qwen3-MoE hold).
struct HfParameter {
  Shape global_shape;
  std::vector<HfPiece> pieces;
};
HfParameter hf_parameter(const model::GptConfig& model, const HfNaming& naming,
                         std::string_view name);

// Every Hugging Face tensor of the model and its shape, in the order the model's layers hold
// them: what an import requires and an export writes.
std::vector<std::pair<std::string, Shape>> hf_tensors(const model::GptConfig& model,
                                                      const HfNaming& naming);

// Which layers of a Qwen3-MoE model hold the MoE block (transformers' Qwen3MoeDecoderLayer):
// layer l does when l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0; the
// others hold a dense MLP of intermediate_size (the model's mlp_width(); the experts are
// moe_intermediate_size wide). Mixtral has an MoE block in every layer.
struct HfSparseLayers {
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;  // ascending
};
// The dense blocks of a model of `layers` blocks with these settings, ascending: its
// moe.dense_layers, with moe.every = 1.
std::vector<std::int64_t> hf_dense_layers(std::int64_t layers, const HfSparseLayers& sparse);
// The settings that make exactly model's MoE blocks sparse (model.is_moe_block): the step whose
// layers hold every MoE block and the fewest dense ones (those go to mlp_only_layers), the
// smallest such step on a tie. Settings read from a config.json come back as they were unless
// a larger step would list fewer layers (step 1 with [] for every layer sparse; step 2 with []
// for every other one).
HfSparseLayers hf_sparse_layers(const model::GptConfig& model);

// The global names of our parameters of the whole model (one copy of a tied table), in the
// order of hf_tensors' first use of them.
std::vector<std::string> hf_parameter_names(const model::GptConfig& model);

}  // namespace quintet::train
