// A model as a Hugging Face checkpoint directory (hf_export.hpp).
#include "quintet/parallel/train/hf_export.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/data/safetensors.hpp"
#include "quintet/parallel/train/checkpointer.hpp"

namespace quintet::train {

namespace fs = std::filesystem;

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out.good()) QUINTET_THROW(System, "Hugging Face export: cannot write {}", path.string());
}

// The config.json of tokenizer_dir (the model the run started from), or null.
nlohmann::json source_config(const HfExportOptions& o) {
  const fs::path source = fs::path(o.tokenizer_dir) / "config.json";
  if (o.tokenizer_dir.empty() || !fs::is_regular_file(source)) return nullptr;
  return nlohmann::json::parse(read_text(source), nullptr, false);
}

// bos_token_id / eos_token_id: the options', else those of the source model, else none.
void token_ids(const HfExportOptions& o, const nlohmann::json& from, Json* config) {
  std::int64_t ids[2] = {o.bos_token_id, o.eos_token_id};
  const char* keys[2] = {"bos_token_id", "eos_token_id"};
  for (int i = 0; i < 2; ++i) {
    if (ids[i] >= 0) {
      (*config)[keys[i]] = ids[i];
    } else if (from.is_object() && from.contains(keys[i]) && !from[keys[i]].is_null()) {
      (*config)[keys[i]] = from[keys[i]];  // an integer, or a list of them (Llama 3's eos)
    }
  }
}

// A float as the shortest decimal that reads back as it (1e-05, not 9.999999747378752e-06), as
// Python writes the configs' values.
double decimal(float x) { return std::stod(fmt::format("{}", x)); }

// Where piece p of one of our parameters lies in its Hugging Face tensor hf (a view of it).
Tensor hf_box(const Tensor& hf, const HfPiece& p) {
  Tensor box = hf;
  for (std::size_t d = 0; d < p.hf_shape.size(); ++d) {
    const std::size_t ours = d + (p.sizes.size() - p.hf_shape.size());
    box = box.narrow(static_cast<int>(d), p.hf_start[d], p.sizes[ours]);
  }
  return box;
}

}  // namespace

DType parse_hf_export_dtype(std::string_view name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  QUINTET_THROW(InvalidArgument,
                "--export-dtype {}: expected f32 (the master weights, the default) or bf16", name);
}

HfArchitecture hf_architecture(const model::GptConfig& m) {
  const auto refuse = [&](std::string_view why) {
    QUINTET_THROW(InvalidArgument,
                  "Hugging Face export: this {} model has no Hugging Face layout here: {}; "
                  "Quintet exports Llama, Qwen2, Qwen3, Mixtral and Qwen3-MoE models (--arch "
                  "llama, qwen3, mixtral, qwen3-moe; Qwen2 from --init-from-hf)",
                  model::model_family_name(m.family), why);
  };
  if (m.norm != nn::NormKind::rmsnorm) refuse("its norms are LayerNorm, not RMSNorm");
  if (m.activation != nn::Activation::swiglu) refuse("its MLP is GELU, not SwiGLU");
  if (!m.rope || m.learned_positions) refuse("it has learned positions, not RoPE");
  const bool qkv_bias_only = m.bias && !m.proj_bias;  // Qwen2's attention
  if (qkv_bias_only && (m.qk_norm || m.mlp == model::MlpKind::moe))
    refuse(
        "its attention has biases on q, k and v but not on the output projection, which only "
        "Qwen2 has");
  if (qkv_bias_only) {
    if (m.head_size() * m.heads != m.hidden)
      refuse("Qwen2's heads are hidden / heads wide, and head_dim is not");
    return {"Qwen2ForCausalLM", "qwen2", {}};
  }
  if (m.mlp != model::MlpKind::moe)
    return m.qk_norm ? HfArchitecture{"Qwen3ForCausalLM", "qwen3", {}}
                     : HfArchitecture{"LlamaForCausalLM", "llama", {}};
  const expert::RouterConfig& r = m.moe.router;
  if (m.moe.shared_experts != 0) refuse("it has shared experts");
  if (r.score != expert::RouterScore::softmax) refuse("its router scores by a sigmoid");
  if (r.bias_rate != 0) refuse("its router selects with a balancing bias (--aux-free-bias-rate)");
  if (m.qk_norm) return {"Qwen3MoeForCausalLM", "qwen3_moe", {}};  // any dense layers
  for (std::int64_t l = 0; l < m.layers; ++l) {
    if (!m.is_moe_block(l))
      refuse(fmt::format(
          "Mixtral has an MoE block in every layer, and block {} is dense (--moe-every, "
          "--dense-layers; Qwen3-MoE's QK-norm model, --arch qwen3-moe, takes dense layers)",
          l));
  }
  if (m.bias) refuse("Mixtral's attention has no biases");
  if (!r.renormalize) refuse("Mixtral renormalizes the top-k weights, and this router does not");
  return {"MixtralForCausalLM", "mixtral", hf_naming(model::ModelFamily::mixtral)};
}

std::string hf_config_json(const model::GptConfig& m, const HfExportOptions& o) {
  const HfArchitecture arch = hf_architecture(m);
  const bool moe = m.mlp == model::MlpKind::moe;
  const bool qwen =
      arch.model_type == "qwen2" || arch.model_type == "qwen3" || arch.model_type == "qwen3_moe";
  Json c;
  c["architectures"] = {arch.cls};
  c["model_type"] = arch.model_type;
  c["torch_dtype"] = o.dtype == DType::bf16 ? "bfloat16" : "float32";
  c["vocab_size"] = m.vocab;
  c["hidden_size"] = m.hidden;
  c["num_hidden_layers"] = m.layers;
  c["num_attention_heads"] = m.heads;
  c["num_key_value_heads"] = m.kv_head_count();
  c["head_dim"] = m.head_size();
  c["hidden_act"] = "silu";
  // The options', else the source model's (the run trained on sequences no longer), else the
  // run's sequence length.
  const nlohmann::json from = source_config(o);
  if (o.max_position_embeddings > 0) {
    c["max_position_embeddings"] = o.max_position_embeddings;
  } else if (from.is_object() && from.contains("max_position_embeddings") &&
             from["max_position_embeddings"].is_number_integer()) {
    c["max_position_embeddings"] = from["max_position_embeddings"];
  } else {
    c["max_position_embeddings"] = m.seq_len;
  }
  c["rms_norm_eps"] = decimal(m.eps);
  c["rope_theta"] = m.rope_theta;
  // Llama 3's frequency scaling (rope_type llama3), as Llama 3.1 and later write it; else none.
  const nn::RopeScaling& rs = m.rope_scaling;
  if (rs.factor > 0) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rs.factor},
                         {"low_freq_factor", rs.low_freq_factor},
                         {"high_freq_factor", rs.high_freq_factor},
                         {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["tie_word_embeddings"] = m.tied_embeddings;
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = decimal(m.init_std);
  c["use_cache"] = true;
  // Mixtral's attention has no biases, Qwen2's always has them on q, k and v (no key for either).
  if (arch.model_type != "mixtral" && arch.model_type != "qwen2") c["attention_bias"] = m.bias;
  if (arch.model_type == "llama") {
    c["intermediate_size"] = m.mlp_width();
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  }
  if (qwen) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = m.layers;
  }
  if (arch.model_type == "qwen2" || arch.model_type == "qwen3")
    c["intermediate_size"] = m.mlp_width();
  if (moe) {
    const expert::RouterConfig& r = m.moe.router;
    c["num_experts_per_tok"] = r.top_k;
    c["output_router_logits"] = false;
    c["router_aux_loss_coef"] = decimal(r.aux_loss_coeff);
    if (arch.model_type == "mixtral") {
      c["intermediate_size"] = m.expert_width();
      c["num_local_experts"] = r.experts;
      c["router_jitter_noise"] = 0.0;
      c["sliding_window"] = nullptr;
    } else {
      c["intermediate_size"] = m.mlp_width();  // the dense layers'
      c["moe_intermediate_size"] = m.expert_width();
      c["num_experts"] = r.experts;  // 4's name; 5's Qwen3MoeConfig maps it to num_local_experts
      c["norm_topk_prob"] = r.renormalize;
      const HfSparseLayers sparse = hf_sparse_layers(m);
      c["decoder_sparse_step"] = sparse.decoder_sparse_step;
      c["mlp_only_layers"] = sparse.mlp_only_layers;
    }
  }
  token_ids(o, from, &c);
  return c.dump(2) + "\n";
}

void check_hf_export(const model::GptConfig& m, const std::string& dir, const HfExportOptions& o) {
  hf_architecture(m);
  QUINTET_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16,
                "Hugging Face export: dtype {} (expected f32 or bf16)", dtype_name(o.dtype));
  QUINTET_CHECK(o.max_shard_bytes > 0, "Hugging Face export: max_shard_bytes must be > 0");
  QUINTET_CHECK(!dir.empty(), "Hugging Face export: no directory given");
  std::error_code ec;
  const fs::file_status s = fs::status(dir, ec);
  QUINTET_CHECK(!fs::exists(s),
                "Hugging Face export: {} exists already (as a {}); export into a new directory",
                dir, fs::is_directory(s) ? "directory" : "file");
  // The directories above dir are made as a checkpoint's are (--export-hf out/llama with no out
  // yet); the nearest one that exists must be a directory.
  fs::path parent = fs::path(dir).parent_path();
  while (!parent.empty() && !fs::exists(parent, ec)) parent = parent.parent_path();
  if (parent.empty()) parent = ".";
  QUINTET_CHECK(fs::is_directory(parent, ec), "Hugging Face export: {}: {} is not a directory", dir,
                parent.string());
  QUINTET_CHECK(o.tokenizer_dir.empty() || fs::is_directory(o.tokenizer_dir, ec),
                "Hugging Face export: the tokenizer directory {} is not a directory",
                o.tokenizer_dir);
}

HfExportPlan plan_hf_export(const model::GptConfig& m, const HfExportOptions& o) {
  const auto tensors = hf_tensors(m, hf_architecture(m).naming);
  std::vector<std::uint64_t> bytes;
  for (const auto& [name, shape] : tensors)
    bytes.push_back(static_cast<std::uint64_t>(shape_numel(shape)) * dtype_size(o.dtype));
  const auto files = data::plan_safetensors_shards(bytes, o.max_shard_bytes);
  HfExportPlan plan;
  for (std::size_t f = 0; f < files.size(); ++f) {
    plan.files.push_back(
        files.size() == 1 ? "model.safetensors"
                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, files.size()));
    plan.tensors.emplace_back();
    for (std::size_t i : files[f]) plan.tensors.back().push_back(tensors[i]);
  }
  return plan;
}

std::string hf_export_partial_dir(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d + ".partial";
}

void write_hf_export_file(const std::string& partial_dir, const model::GptConfig& m,
                          const HfExportPlan& plan, std::size_t i, const HfExportOptions& o,
                          const HfBoxSource& source) {
  const HfNaming naming = hf_architecture(m).naming;
  // Which of our parameters' pieces make up each tensor of the file.
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, shape] : plan.tensors.at(i))
    tensors.emplace(name, Tensor::zeros(shape, DType::f32));
  for (const std::string& ours : hf_parameter_names(m)) {
    const HfParameter param = hf_parameter(m, naming, ours);
    for (const HfPiece& p : param.pieces) {
      const auto it = tensors.find(p.hf_name);
      if (it == tensors.end()) continue;
      Tensor box = Tensor::empty(p.sizes, DType::f32);
      source(ours, param.global_shape, p.start, box);
      hf_box(it->second, p).copy_(box.view(hf_box(it->second, p).shape()));
    }
  }
  std::vector<data::NamedTensor> out;
  for (const auto& [name, shape] : plan.tensors.at(i)) {
    const Tensor& t = tensors.at(name);
    out.push_back({name, o.dtype == DType::f32 ? t : t.to(o.dtype)});
  }
  data::write_safetensors((fs::path(partial_dir) / plan.files.at(i)).string(), out,
                          {{"format", "pt"}});
}

void commit_hf_export(const std::string& partial_dir, const std::string& dir,
                      const model::GptConfig& m, const HfExportPlan& plan,
                      const HfExportOptions& o) {
  const fs::path partial(partial_dir);
  if (plan.files.size() > 1) {
    Json index;
    std::uint64_t total = 0;
    nlohmann::json map = nlohmann::json::object();  // sorted by name, as transformers writes it
    for (std::size_t f = 0; f < plan.files.size(); ++f) {
      for (const auto& [name, shape] : plan.tensors[f]) {
        total += static_cast<std::uint64_t>(shape_numel(shape)) * dtype_size(o.dtype);
        map[name] = plan.files[f];
      }
    }
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = std::move(map);
    write_text(partial / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(partial / "config.json", hf_config_json(m, o));
  if (!o.tokenizer_dir.empty()) {
    for (const char* name : kTokenizerFiles) {
      const fs::path from = fs::path(o.tokenizer_dir) / name;
      if (fs::is_regular_file(from)) fs::copy_file(from, partial / name);
    }
  }
  std::error_code ec;
  fs::rename(partial, dir, ec);
  if (ec) {
    QUINTET_THROW(System, "Hugging Face export: cannot rename {} to {}: {}", partial_dir, dir,
                  ec.message());
  }
}

void export_hf(const std::string& dir, const model::GptConfig& m, const HfExportOptions& o,
               const HfBoxSource& source) {
  check_hf_export(m, dir, o);
  const HfExportPlan plan = plan_hf_export(m, o);
  const std::string partial = hf_export_partial_dir(dir);
  try {
    fs::remove_all(partial);
    fs::create_directories(partial);
    for (std::size_t i = 0; i < plan.files.size(); ++i)
      write_hf_export_file(partial, m, plan, i, o, source);
    commit_hf_export(partial, dir, m, plan, o);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
}

void export_hf(const std::string& dir, TrainingModel& model, Communicator& world,
               const HfExportOptions& o) {
  const model::GptConfig& m = model.config().model;
  const int rank = world.rank();
  checkpoint::run_on_every_rank(world, "Hugging Face export: checking",
                                [&] { check_hf_export(m, dir, o); });
  const HfExportPlan plan = plan_hf_export(m, o);
  const std::string partial = hf_export_partial_dir(dir);
  const std::string pieces = (fs::path(partial) / "pieces").string();
  try {
    checkpoint::run_on_every_rank(world, "Hugging Face export: preparing", [&] {
      if (rank == 0) fs::remove_all(partial);
    });
    checkpoint::save_checkpoint(pieces, 0, master_weight_pieces(model), "{}", world,
                                model.stream());
    checkpoint::run_on_every_rank(world, "Hugging Face export: writing", [&] {
      const auto info = checkpoint::latest_checkpoint(pieces);
      QUINTET_CHECK(info.has_value(), "Hugging Face export: {} holds no pieces", pieces);
      const checkpoint::GlobalIndex index(*info);
      for (std::size_t i = static_cast<std::size_t>(rank); i < plan.files.size();
           i += static_cast<std::size_t>(world.size()))
        write_hf_export_file(partial, m, plan, i, o, hf_checkpoint_source(index));
    });
    checkpoint::run_on_every_rank(world, "Hugging Face export: committing", [&] {
      if (rank != 0) return;
      fs::remove_all(pieces);
      commit_hf_export(partial, dir, m, plan, o);
    });
  } catch (...) {
    std::error_code ec;
    if (rank == 0) fs::remove_all(partial, ec);
    throw;
  }
}

HfBoxSource hf_checkpoint_source(const checkpoint::GlobalIndex& index) {
  return [&index](const std::string& name, const Shape& global_shape, const Shape& start,
                  const Tensor& target) {
    const char* field = index.has("master", name) ? "master" : "value";
    const auto* pieces = index.find(field, name);
    QUINTET_CHECK(pieces != nullptr && !pieces->empty(),
                  "Hugging Face export: {} holds no {} of the parameter {}",
                  index.checkpoint().path, field, name);
    const DType saved = pieces->front().entry.dtype;
    if (saved == target.dtype()) {
      index.assemble(field, name, global_shape, start, target, Stream());
    } else {
      Tensor box = Tensor::empty(target.shape(), saved);
      index.assemble(field, name, global_shape, start, box, Stream());
      Tensor out = target;
      out.copy_(box.to(target.dtype()));
    }
  };
}

void export_hf_checkpoint(const checkpoint::CheckpointInfo& checkpoint, const std::string& dir,
                          const HfExportOptions& options) {
  const model::GptConfig m = checkpoint_model(checkpoint);
  check_hf_export(m, dir, options);
  const checkpoint::GlobalIndex index(checkpoint);
  // Every parameter the export needs is in the checkpoint, before anything is written.
  for (const std::string& name : hf_parameter_names(m)) {
    QUINTET_CHECK(index.has("master", name) || index.has("value", name),
                  "Hugging Face export: {} has no parameter {}, which a {} model has",
                  checkpoint.path, name, hf_architecture(m).cls);
  }
  export_hf(dir, m, options, hf_checkpoint_source(index));
}

}  // namespace quintet::train
