// Writing a model as a Hugging Face checkpoint (parallel/train/hf_export.cpp): a directory as
// transformers' save_pretrained writes it, which transformers, vLLM and SGLang load.
//
//   DIR/config.json                         the architecture's config (hf_config_json)
//   DIR/model.safetensors                   every tensor, when they fit in max_shard_bytes; else
//   DIR/model-0000i-of-0000N.safetensors    files of at most max_shard_bytes (a larger tensor gets
//   DIR/model.safetensors.index.json        a file of its own) and the index of their tensors
//   DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json
//                                           copied from tokenizer_dir (the --init-from-hf
//                                           directory) where it has them
//
// Names and shapes are hf_names.hpp's, with the per-expert names every transformers version loads
// (Mixtral: block_sparse_moe.experts.E.{w1,w3,w2}; Qwen3-MoE: mlp.experts.E.{gate,up,down}_proj).
// The architecture comes from the model's structure: Llama (LlamaForCausalLM; attention biases
// as attention_bias), Qwen2 (biases on q, k and v only: GptConfig::proj_bias off), Qwen3
// (QK-norm), Mixtral (MoE), Qwen3-MoE (MoE with QK-norm; its dense layers, moe.every and
// moe.dense_layers, as decoder_sparse_step and mlp_only_layers: hf_sparse_layers, and their MLP
// as intermediate_size). A model of another structure (GPT-2's LayerNorm, GELU, learned
// positions; shared experts, Mixtral with dense layers, a sigmoid router) has no Hugging Face
// layout here and is refused.
//
// The directory is written atomically: into DIR.partial (removed first, when an earlier export
// was cut short), renamed to DIR when every file is complete, so a failed export leaves nothing
// at DIR. DIR must not exist. dtype f32 (the master weights: the export loses nothing) or bf16
// (rounded to nearest even); config.json's torch_dtype says which.
//
// Where the values come from is the caller's: an HfBoxSource fills boxes of Quintet's global
// parameters (a checkpoint's GlobalIndex::assemble, or a model's own parameters). Memory: the
// tensors of one file at a time (f32, and their bf16 copy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/parallel/checkpoint/global_index.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/train/hf_names.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace quintet::train {

struct HfExportOptions {
  DType dtype = DType::f32;                       // f32 or bf16 (parse_hf_export_dtype)
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' "5GB"
  // "" or the source model's directory (--init-from-hf's): its tokenizer files are copied, its
  // config.json's max_position_embeddings and bos/eos ids taken.
  std::string tokenizer_dir;
  // 0: the source model's if there is one, else the model's seq_len.
  std::int64_t max_position_embeddings = 0;
  std::int64_t bos_token_id = -1, eos_token_id = -1;  // written when >= 0
};

// "f32" or "bf16"; InvalidArgument naming --export-dtype otherwise.
DType parse_hf_export_dtype(std::string_view name);

// The Hugging Face architecture of a model.
struct HfArchitecture {
  std::string cls;         // "LlamaForCausalLM", ...
  std::string model_type;  // "llama", ...
  HfNaming naming;         // the per-expert names
};
// Throws InvalidArgument, saying why, for a model with no Hugging Face layout (see above).
HfArchitecture hf_architecture(const model::GptConfig& model);

// config.json's text for model (see hf_architecture): architectures, model_type, torch_dtype and
// every size transformers' config class of that architecture reads.
std::string hf_config_json(const model::GptConfig& model, const HfExportOptions& options);

// Everything an export checks before it writes anything (and a trainer before any
// communication): the model has a layout, dtype is f32 or bf16, max_shard_bytes > 0, DIR does not
// exist (as a file or a directory) and its parent is a directory, tokenizer_dir (when given) is a
// directory. Throws InvalidArgument naming what is wrong.
void check_hf_export(const model::GptConfig& model, const std::string& dir,
                     const HfExportOptions& options);

// Fills target (f32, contiguous, on the CPU) with the box [start, start + target.shape()) of
// Quintet's global parameter `name` (hf_parameter_names) of global_shape.
using HfBoxSource = std::function<void(const std::string& name, const Shape& global_shape,
                                       const Shape& start, const Tensor& target)>;

// The files of an export: each file's name and its tensors (name, shape), in the order of
// hf_tensors, split by bytes in options.dtype as plan_safetensors_shards splits them.
struct HfExportPlan {
  std::vector<std::string> files;
  std::vector<std::vector<std::pair<std::string, Shape>>> tensors;  // per file
};
HfExportPlan plan_hf_export(const model::GptConfig& model, const HfExportOptions& options);

// The temporary directory an export of dir writes into (DIR.partial).
std::string hf_export_partial_dir(const std::string& dir);

// Writes file i of plan into partial_dir from source (its tensors assembled in f32, converted).
void write_hf_export_file(const std::string& partial_dir, const model::GptConfig& model,
                          const HfExportPlan& plan, std::size_t i, const HfExportOptions& options,
                          const HfBoxSource& source);
// Writes the index (when there are several files), config.json and the tokenizer files into
// partial_dir, then renames it to dir.
void commit_hf_export(const std::string& partial_dir, const std::string& dir,
                      const model::GptConfig& model, const HfExportPlan& plan,
                      const HfExportOptions& options);

// All of it in this process: check_hf_export, every file, commit. On an error, what was written
// is removed and the error rethrown.
void export_hf(const std::string& dir, const model::GptConfig& model,
               const HfExportOptions& options, const HfBoxSource& source);

// A training run's model exported to dir (the trainers' --export-hf), collective over world (the
// job's CPU communicator, as the Checkpointer's). Every rank checks first, before any other
// communication (check_hf_export; an error on one is an error on every one). Then each rank
// writes its pieces of the master weights (master_weight_pieces: only the boxes it holds, one
// rank per replica group) into DIR.partial as a checkpoint of pieces, and the safetensors files
// are shared out between the ranks (file i by rank i mod world), each assembling its files'
// tensors from those pieces (GlobalIndex): no rank gathers more of the model than the tensors of
// its own files, and no tensor travels through the communicator. Rank 0 removes the pieces,
// writes the index, config.json and the tokenizer files and renames DIR.partial to DIR. The
// ranks must share the file system DIR is on. On an error, DIR.partial is removed.
void export_hf(const std::string& dir, TrainingModel& model, Communicator& world,
               const HfExportOptions& options);

// The boxes of a checkpoint's global tensors: field "master" (the f32 master weights) where the
// checkpoint has it, else "value" (converted to f32), read with GlobalIndex::assemble.
HfBoxSource hf_checkpoint_source(const checkpoint::GlobalIndex& index);

// A checkpoint written by a Checkpointer (its model from checkpoint_model) exported to dir, in
// this process, without MPI or a GPU (12_checkpoint_tool --to-hf). Everything is checked before
// anything is written.
void export_hf_checkpoint(const checkpoint::CheckpointInfo& checkpoint, const std::string& dir,
                          const HfExportOptions& options);

}  // namespace quintet::train
