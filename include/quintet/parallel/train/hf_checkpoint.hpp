// Starting a run from a Hugging Face checkpoint (parallel/train/hf_config.cpp, hf_import.cpp):
// a directory as save_pretrained writes it, config.json beside model.safetensors (or its shards
// and model.safetensors.index.json), of a Llama (LlamaForCausalLM), Qwen2 (Qwen2ForCausalLM: the
// llama family with biases on q, k and v only, GptConfig::proj_bias off), Qwen3
// (Qwen3ForCausalLM), Mixtral (MixtralForCausalLM) or Qwen3-MoE (Qwen3MoeForCausalLM) model.
//
//   train::JobConfig job = ...;                                  // flags, job file
//   const train::HfModel hf = train::read_hf_config(dir);        // config.json
//   train::apply_hf_config(hf, &job);                            // the model from it
//   job.validate(world.size());
//   train::TrainingModel model(job, mesh, stream);
//   train::load_hf_weights(hf, model, world.comm());             // at any layout
//
// The trainers do this for --init-from-hf DIR (parse_job_args applies the config, refusing flags
// that contradict it; the trainer loads the weights after building the model).
//
// What config.json sets (GptConfig): the family's structure (set_family: RMSNorm, SwiGLU, RoPE,
// QK-norm for Qwen3), hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, intermediate_size (Mixtral: each expert's), vocab_size, rope_theta (or transformers
// 5's rope_parameters), Llama 3.1's RoPE scaling (rope_type llama3: GptConfig::rope_scaling),
// rms_norm_eps (every norm's eps, QK-norm's included, as Hugging Face
// does), tie_word_embeddings, attention_bias; for MoE the expert count (num_local_experts or
// num_experts for either family: transformers 5's Qwen3-MoE writes the first, 4's the second),
// num_experts_per_tok, moe_intermediate_size and norm_topk_prob (Mixtral always renormalizes);
// Qwen3-MoE's dense layers, those decoder_sparse_step skips and those mlp_only_layers lists
// (hf_dense_layers), become moe.dense_layers (moe.every 1), their MLP intermediate_size wide.
// Refused, naming the key and the file, for what Quintet cannot run as Hugging Face does: an
// unknown architecture, hidden_act other than silu, another rope scaling (rope_type
// other than default and llama3), mlp_bias, sliding-window attention, router jitter noise,
// an mlp_only_layers entry that is no layer, Qwen3-MoE settings that leave no layer sparse. The
// sequence length stays the job's (at most max_position_embeddings).
//
// Loading: each rank reads from the safetensors files (memory-mapped, data/safetensors.hpp) only
// the boxes of the tensors its parameters hold (tp, pp with vpp, ep, etp shards; cp and dp
// replicas read the same boxes), converted from the file's dtype (F32, BF16, F16) to the f32
// master weights, which the compute-dtype values are rounded from; the optimizer starts fresh
// (moments zero, step 0), as at init. Before any communication, every rank checks the whole
// checkpoint against the model: every tensor the model needs is there with the shape config.json
// implies, and every tensor there is one the model uses (a stray q_proj.bias would otherwise be
// dropped silently); errors name the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "quintet/collectives/communicator.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/train/hf_names.hpp"
#include "quintet/parallel/train/job_config.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace quintet::train {

// A Hugging Face model directory's config.json, as Quintet reads it.
struct HfModel {
  std::string dir;
  std::string config_path;   // dir/config.json
  std::string architecture;  // "LlamaForCausalLM", ... (from architectures, else model_type)
  std::string model_type;    // "llama", "qwen2", "qwen3", "mixtral", "qwen3_moe"
  // The model: the family's structure and config.json's sizes over GptConfig's defaults (its
  // layout settings, seq_len and dtype are not config.json's: apply_hf_config keeps the job's).
  model::GptConfig model;
  std::int64_t max_position_embeddings = 0;  // 0: not given
  std::int64_t sliding_window = 0;           // Mixtral's; 0: none
  HfNaming naming;  // Mixtral's or Qwen3-MoE's expert names (the fused form is the files')
};

// Reads dir/config.json. Throws InvalidArgument naming the file (and the key) when it is missing
// or not JSON, names an architecture other than the four, lacks a size, holds a value of the
// wrong type or one Quintet cannot honour (see above).
HfModel read_hf_config(const std::string& dir);

// Sets job->model from hf: the family, sizes and structure above (and, for an MoE model, the
// router's experts, top_k, renormalization, the expert width and the dense layers), keeping the
// job's layout settings, sequence length, dtype and the MoE settings config.json has no say on
// (capacity, balancing losses). given(flag) says whether a model flag was given ("hidden",
// "kv-heads", "arch", ...: the flag's name without dashes); a given flag whose value differs from
// config.json's is refused, naming both. Also refused: an MoE model in a dense job (or the
// reverse: MoE jobs come from JobConfig::moe_preset()), seq_len beyond max_position_embeddings.
// Throws InvalidArgument; changes nothing then.
void apply_hf_config(const HfModel& hf, JobConfig* job,
                     const std::function<bool(std::string_view flag)>& given = {});

// Loads hf's weights into every stage of model (built from a job that apply_hf_config set, at
// any layout) and restarts its optimizer (master weights from the file, moments zero, step 0).
// Checks the checkpoint first (see above) on every rank, before any communication: throws
// InvalidArgument naming the file and the tensor for a missing, misshapen or unused tensor, a
// malformed safetensors file or index, and for a model that is not hf's. The reading itself is
// collective over world (run_on_every_rank): an I/O error on one rank is an error on every rank.
void load_hf_weights(const HfModel& hf, TrainingModel& model, Communicator& world);

}  // namespace quintet::train
