// Hugging Face export (train/hf_export.hpp): a model's parameters written under the Hub's names
// and shapes, split into files with their index, config.json of the architecture, bf16 rounded
// as Tensor::to does; from a checkpoint's pieces too; bad inputs refused before anything is
// written, and a failed export leaves nothing behind.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/data/safetensors.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/checkpoint/global_index.hpp"
#include "quintet/parallel/train/checkpointer.hpp"
#include "quintet/parallel/train/hf_export.hpp"
#include "support/catch.hpp"

using namespace quintet;
using quintet::model::GptConfig;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system's temporary one, removed when the test ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("quintet_hf_export_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

GptConfig sized(GptConfig m) {
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.vocab = 40;
  m.seq_len = 8;
  m.ffn_hidden = 24;
  return m;
}
GptConfig llama_gqa() {
  GptConfig m = sized(GptConfig::llama());
  m.kv_heads = 2;
  return m;
}
GptConfig qwen2() {  // biases on q, k and v, none on the output projection
  GptConfig m = llama_gqa();
  m.bias = true;
  m.proj_bias = false;
  return m;
}
GptConfig llama_biases() {  // attention_bias: all four projections
  GptConfig m = sized(GptConfig::llama());
  m.bias = true;
  return m;
}
GptConfig llama31() {  // Llama 3.1's RoPE scaling
  GptConfig m = llama_gqa();
  m.rope_scaling = {8.0, 1.0, 4.0, 8192};
  return m;
}
GptConfig qwen3_tied() {
  GptConfig m = sized(GptConfig::qwen3());
  m.head_dim = 8;
  m.tied_embeddings = true;
  return m;
}
GptConfig mixtral() {
  GptConfig m = sized(GptConfig::mixtral());
  m.kv_heads = 2;
  m.moe.router.experts = 4;
  return m;
}
GptConfig qwen3_moe() {
  GptConfig m = sized(GptConfig::qwen3_moe());
  m.moe.router.experts = 4;
  m.moe.router.top_k = 2;
  m.moe.expert_ffn = 12;
  return m;
}

GptConfig qwen3_moe_dense_first() {  // block 0 dense (24 wide), block 1 MoE
  GptConfig m = qwen3_moe();
  m.moe.dense_layers = {0};
  return m;
}

// Every global parameter of m, random.
std::map<std::string, Tensor> parameters(const GptConfig& m) {
  std::map<std::string, Tensor> out;
  const train::HfNaming naming = train::hf_architecture(m).naming;
  std::uint64_t seed = 1;
  for (const std::string& name : train::hf_parameter_names(m))
    out.emplace(name, Tensor::randn(train::hf_parameter(m, naming, name).global_shape, seed++));
  return out;
}

Tensor box(Tensor t, const Shape& start, const Shape& sizes) {
  for (std::size_t d = 0; d < sizes.size(); ++d)
    t = t.narrow(static_cast<int>(d), start[d], sizes[d]);
  return t.contiguous();
}

train::HfBoxSource source_of(const std::map<std::string, Tensor>& params) {
  return [&params](const std::string& name, const Shape& global, const Shape& start,
                   const Tensor& target) {
    const Tensor& p = params.at(name);
    REQUIRE(p.shape() == global);
    Tensor out = target;
    out.copy_(box(p, start, target.shape()));
  };
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// (Hugging Face name, our parameter, index in its leading dimension or -1 for the whole of it):
// the mapping written out by hand, for layer 1 and the model's ends.
struct Expect {
  std::string hf, ours;
  int index = -1;
};
std::vector<Expect> expectations(const GptConfig& m) {
  const std::string L = "model.layers.1.", a = L + "self_attn.";
  std::vector<Expect> e{{"model.embed_tokens.weight", "wte.weight"},
                        {"model.norm.weight", "norm.weight"},
                        {L + "input_layernorm.weight", "block1.norm1.weight"},
                        {L + "post_attention_layernorm.weight", "block1.norm2.weight"},
                        {a + "o_proj.weight", "block1.attn.proj.weight"}};
  if (!m.tied_embeddings) e.push_back({"lm_head.weight", "lm_head.weight"});
  if (m.kv_head_count() != m.heads) {
    e.push_back({a + "q_proj.weight", "block1.attn.q.weight"});
    e.push_back({a + "k_proj.weight", "block1.attn.kv.weight", 0});
    e.push_back({a + "v_proj.weight", "block1.attn.kv.weight", 1});
  } else {
    for (int i = 0; i < 3; ++i)
      e.push_back({a + std::string(1, "qkv"[i]) + "_proj.weight", "block1.attn.qkv.weight", i});
  }
  if (m.bias && m.kv_head_count() != m.heads) {
    e.push_back({a + "q_proj.bias", "block1.attn.q.bias"});
    e.push_back({a + "k_proj.bias", "block1.attn.kv.bias", 0});
    e.push_back({a + "v_proj.bias", "block1.attn.kv.bias", 1});
  } else if (m.bias) {
    for (int i = 0; i < 3; ++i)
      e.push_back({a + std::string(1, "qkv"[i]) + "_proj.bias", "block1.attn.qkv.bias", i});
  }
  if (m.bias && m.proj_bias) e.push_back({a + "o_proj.bias", "block1.attn.proj.bias"});
  if (m.qk_norm) {
    e.push_back({a + "q_norm.weight", "block1.attn.q_norm.weight"});
    e.push_back({a + "k_norm.weight", "block1.attn.k_norm.weight"});
  }
  if (m.mlp != model::MlpKind::moe) {
    e.push_back({L + "mlp.gate_proj.weight", "block1.mlp.fc.weight"});
    e.push_back({L + "mlp.up_proj.weight", "block1.mlp.up.weight"});
    e.push_back({L + "mlp.down_proj.weight", "block1.mlp.proj.weight"});
  } else if (m.qk_norm) {  // Qwen3-MoE
    e.push_back({L + "mlp.gate.weight", "block1.mlp.router.weight"});
    e.push_back({L + "mlp.experts.3.gate_proj.weight", "block1.mlp.experts.fc.weight", 3});
    e.push_back({L + "mlp.experts.3.up_proj.weight", "block1.mlp.experts.up.weight", 3});
    e.push_back({L + "mlp.experts.0.down_proj.weight", "block1.mlp.experts.proj.weight", 0});
  } else {  // Mixtral
    e.push_back({L + "block_sparse_moe.gate.weight", "block1.mlp.router.weight"});
    e.push_back({L + "block_sparse_moe.experts.2.w1.weight", "block1.mlp.experts.fc.weight", 2});
    e.push_back({L + "block_sparse_moe.experts.2.w3.weight", "block1.mlp.experts.up.weight", 2});
    e.push_back({L + "block_sparse_moe.experts.1.w2.weight", "block1.mlp.experts.proj.weight", 1});
  }
  return e;
}

// The export at dir holds every tensor of hf_tensors, each equal (bitwise, in dtype) to its part
// of params.
void check_export(const std::string& dir, const GptConfig& m,
                  const std::map<std::string, Tensor>& params, DType dtype) {
  const auto cp = data::SafetensorsCheckpoint::open(dir);
  std::vector<std::string> names;
  for (const auto& [name, shape] : train::hf_tensors(m, train::hf_architecture(m).naming)) {
    names.push_back(name);
    INFO(name);
    REQUIRE(cp.entry(name).shape == shape);
    REQUIRE(cp.entry(name).dtype == dtype);
  }
  std::sort(names.begin(), names.end());
  REQUIRE(cp.names() == names);
  for (const Expect& e : expectations(m)) {
    INFO(e.hf << " <- " << e.ours);
    Tensor ours = params.at(e.ours);
    if (e.index >= 0) {
      Shape part(ours.shape().begin() + 1, ours.shape().end());
      ours = ours.narrow(0, e.index, 1).contiguous().view(part);
    }
    REQUIRE(same_bytes(cp.read(e.hf), ours.to(dtype)));
  }
}

}  // namespace

TEST_CASE("export: Llama, Qwen2, Qwen3, Mixtral and Qwen3-MoE under the Hub's names, in files") {
  const TempDir tmp("names");
  int n = 0;
  for (const GptConfig& m : {llama_gqa(), llama31(), llama_biases(), qwen2(), qwen3_tied(),
                             mixtral(), qwen3_moe(), qwen3_moe_dense_first()}) {
    const train::HfArchitecture arch = train::hf_architecture(m);
    INFO(arch.cls);
    const auto params = parameters(m);
    train::HfExportOptions o;
    o.max_shard_bytes = 3000;  // several files: each tensor here is 64 B .. 2.6 KB in f32
    const std::string dir = tmp / ("f32_" + std::to_string(n));
    train::export_hf(dir, m, o, source_of(params));
    check_export(dir, m, params, DType::f32);
    REQUIRE(fs::exists(dir + "/model.safetensors.index.json"));
    REQUIRE(!fs::exists(train::hf_export_partial_dir(dir)));
    const nlohmann::json index = read_json(dir + "/model.safetensors.index.json");
    std::uint64_t total = 0;
    for (const auto& [name, shape] : train::hf_tensors(m, arch.naming))
      total += static_cast<std::uint64_t>(shape_numel(shape)) * 4;
    REQUIRE(index["metadata"]["total_size"] == total);
    for (const auto& file : train::plan_hf_export(m, o).files) {
      REQUIRE(fs::file_size(dir + "/" + file) <= o.max_shard_bytes + 2048);  // + header
      REQUIRE(data::SafetensorsFile::open(dir + "/" + file).metadata().at("format") == "pt");
    }

    // config.json: what transformers' config class of the architecture reads.
    const nlohmann::json c = read_json(dir + "/config.json");
    REQUIRE(c["architectures"] == nlohmann::json::array({arch.cls}));
    REQUIRE(c["model_type"] == arch.model_type);
    REQUIRE(c["torch_dtype"] == "float32");
    REQUIRE(c["hidden_size"] == 16);
    REQUIRE(c["num_hidden_layers"] == 2);
    REQUIRE(c["num_attention_heads"] == 4);
    REQUIRE(c["num_key_value_heads"] == m.kv_head_count());
    REQUIRE(c["head_dim"] == m.head_size());
    REQUIRE(c["vocab_size"] == 40);
    REQUIRE(c["max_position_embeddings"] == 8);
    REQUIRE(c["tie_word_embeddings"] == m.tied_embeddings);
    REQUIRE(c["rope_theta"] == m.rope_theta);
    REQUIRE(c["rms_norm_eps"] == std::stod(fmt::format("{}", m.eps)));
    REQUIRE(c["hidden_act"] == "silu");
    if (m.rope_scaling.factor > 0) {
      REQUIRE(c["rope_scaling"] == nlohmann::json{{"rope_type", "llama3"},
                                                  {"factor", 8.0},
                                                  {"low_freq_factor", 1.0},
                                                  {"high_freq_factor", 4.0},
                                                  {"original_max_position_embeddings", 8192}});
    } else {
      REQUIRE(c["rope_scaling"].is_null());
    }
    // Qwen2 has q/k/v biases without a key for them, Mixtral no biases and no key.
    if (arch.model_type == "qwen2" || arch.model_type == "mixtral") {
      REQUIRE(!c.contains("attention_bias"));
    } else {
      REQUIRE(c["attention_bias"] == m.bias);
    }
    if (m.mlp == model::MlpKind::moe) {
      REQUIRE(c["num_experts_per_tok"] == m.moe.router.top_k);
      REQUIRE(c[arch.model_type == "mixtral" ? "num_local_experts" : "num_experts"] == 4);
      if (arch.model_type == "mixtral") REQUIRE(c["intermediate_size"] == 24);
      if (arch.model_type == "qwen3_moe") {
        REQUIRE(c["moe_intermediate_size"] == 12);
        REQUIRE(c["norm_topk_prob"] == m.moe.router.renormalize);
        // Every layer sparse, or (block 0 dense) every second one: transformers' layer l is
        // sparse iff (l + 1) % decoder_sparse_step == 0 and l is not in mlp_only_layers.
        const bool dense_first = !m.moe.dense_layers.empty();
        REQUIRE(c["decoder_sparse_step"] == (dense_first ? 2 : 1));
        REQUIRE(c["mlp_only_layers"] == nlohmann::json::array());
        REQUIRE(c["intermediate_size"] == 24);
      }
    } else {
      REQUIRE(c["intermediate_size"] == 24);
    }

    // bf16: each value rounded as Tensor::to rounds (to nearest even), one file when it fits;
    // the final norm's first values are ties: 1 + 2^-8 and 1 + 3 * 2^-8 lie halfway between two
    // bf16 values and go to the even one (1 and 1 + 2^-6), -(1 + 2^-8) to -1.
    const std::string bf = tmp / ("bf16_" + std::to_string(n++));
    o.dtype = DType::bf16;
    o.max_shard_bytes = 5'000'000'000;
    auto tied = params;
    Tensor norm = tied.at("norm.weight").clone();
    const float ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f)};
    for (int i = 0; i < 3; ++i) norm.data<float>()[i] = ties[i];
    tied["norm.weight"] = norm;
    train::export_hf(bf, m, o, source_of(tied));
    check_export(bf, m, tied, DType::bf16);
    const Tensor rounded = data::SafetensorsCheckpoint::open(bf).read("model.norm.weight");
    REQUIRE(rounded.data<BFloat16>()[0].bits == 0x3f80);  // 1
    REQUIRE(rounded.data<BFloat16>()[1].bits == 0x3f82);  // 1 + 2^-6
    REQUIRE(rounded.data<BFloat16>()[2].bits == 0xbf80);  // -1
    REQUIRE(fs::exists(bf + "/model.safetensors"));
    REQUIRE(!fs::exists(bf + "/model.safetensors.index.json"));
    REQUIRE(read_json(bf + "/config.json")["torch_dtype"] == "bfloat16");
  }
}

TEST_CASE("export: the tokenizer files and token ids of the model the run started from") {
  const TempDir tmp("tokenizer");
  const std::string from = tmp / "from";
  fs::create_directories(from);
  std::ofstream(from + "/tokenizer.json") << "{\"version\": \"1.0\"}";
  std::ofstream(from + "/special_tokens_map.json") << "{}";
  std::ofstream(from + "/config.json")
      << "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"max_position_embeddings\": 64}";
  const GptConfig m = llama_gqa();
  const auto params = parameters(m);
  train::HfExportOptions o;
  o.tokenizer_dir = from;
  train::export_hf(tmp / "out", m, o, source_of(params));
  REQUIRE(fs::exists(tmp / "out/tokenizer.json"));
  REQUIRE(fs::exists(tmp / "out/special_tokens_map.json"));
  REQUIRE(!fs::exists(tmp / "out/tokenizer_config.json"));  // the source has none
  const nlohmann::json c = read_json(tmp / "out/config.json");
  REQUIRE(c["bos_token_id"] == 1);
  REQUIRE(c["eos_token_id"] == nlohmann::json::array({2, 3}));
  REQUIRE(c["max_position_embeddings"] == 64);  // the source's, not the run's seq_len (8)
  o.tokenizer_dir.clear();
  o.eos_token_id = 7;
  train::export_hf(tmp / "ids", m, o, source_of(params));
  const nlohmann::json ids = read_json(tmp / "ids/config.json");
  REQUIRE(ids["eos_token_id"] == 7);
  REQUIRE(!ids.contains("bos_token_id"));
  REQUIRE(ids["max_position_embeddings"] == 8);
}

TEST_CASE("export: the directories above DIR are made, as a checkpoint's are") {
  const TempDir tmp("parents");
  const GptConfig m = llama_gqa();
  const auto params = parameters(m);
  train::export_hf(tmp / "no/such/parent", m, train::HfExportOptions{}, source_of(params));
  REQUIRE(fs::is_regular_file(tmp / "no/such/parent/config.json"));
  REQUIRE(!fs::exists(tmp / "no/such/parent.partial"));
}

TEST_CASE("export: bad inputs refused before anything is written; a failure leaves nothing") {
  const TempDir tmp("refused");
  const GptConfig m = llama_gqa();
  const auto params = parameters(m);
  const train::HfExportOptions o;
  std::ofstream(tmp / "a_file") << "x";
  REQUIRE_THROWS_QUINTET(train::export_hf(tmp / "a_file", m, o, source_of(params)), InvalidArgument,
                         "exists already (as a file)");
  fs::create_directories(tmp / "a_dir");
  REQUIRE_THROWS_QUINTET(train::export_hf(tmp / "a_dir", m, o, source_of(params)), InvalidArgument,
                         "exists already (as a directory)");
  REQUIRE_THROWS_QUINTET(train::export_hf(tmp / "a_file/below", m, o, source_of(params)),
                         InvalidArgument,
                         "a_file/below: " + (tmp / "a_file") + " is not a directory");
  REQUIRE_THROWS_QUINTET(train::parse_hf_export_dtype("f16"), InvalidArgument,
                         "--export-dtype f16: expected f32");
  train::HfExportOptions f16 = o;
  f16.dtype = DType::f16;
  REQUIRE_THROWS_QUINTET(train::export_hf(tmp / "f16", m, f16, source_of(params)), InvalidArgument,
                         "dtype f16");
  GptConfig gpt2 = sized(GptConfig::gpt2());
  REQUIRE_THROWS_QUINTET(train::check_hf_export(gpt2, tmp / "gpt2", o), InvalidArgument,
                         "no Hugging Face layout here: its norms are LayerNorm");
  GptConfig qwen3_qkv_bias = qwen3_tied();
  qwen3_qkv_bias.bias = true;
  qwen3_qkv_bias.proj_bias = false;
  REQUIRE_THROWS_QUINTET(train::check_hf_export(qwen3_qkv_bias, tmp / "q", o), InvalidArgument,
                         "which only Qwen2 has");
  GptConfig shared = qwen3_moe();
  shared.moe.shared_experts = 1;
  REQUIRE_THROWS_QUINTET(train::check_hf_export(shared, tmp / "shared", o), InvalidArgument,
                         "shared experts");
  GptConfig mixtral_dense = mixtral();
  mixtral_dense.moe.every = 2;
  REQUIRE_THROWS_QUINTET(train::check_hf_export(mixtral_dense, tmp / "shared", o), InvalidArgument,
                         "Mixtral has an MoE block in every layer, and block 1 is dense");

  // A source that fails in the second file: neither the directory nor its partial one remains.
  train::HfExportOptions split = o;
  split.max_shard_bytes = 3000;
  int calls = 0;
  const auto failing = [&](const std::string& name, const Shape& g, const Shape& s,
                           const Tensor& t) {
    QUINTET_CHECK(++calls < 6, "test: the source fails at {}", name);
    source_of(params)(name, g, s, t);
  };
  REQUIRE_THROWS_QUINTET(train::export_hf(tmp / "failed", m, split, failing), InvalidArgument,
                         "the source fails");
  REQUIRE(!fs::exists(tmp / "failed"));
  REQUIRE(!fs::exists(train::hf_export_partial_dir(tmp / "failed")));
  for (const std::string name : {"gpt2", "shared", "f16"}) REQUIRE(!fs::exists(tmp / name));
}

TEST_CASE("export: a checkpoint's pieces, master weights and model record") {
  const TempDir tmp("checkpoint");
  auto comm = make_self_communicator(Device::cpu(), "hf_export_test");
  int cases = 0;
  for (const GptConfig& m : {mixtral(), qwen3_tied(), qwen2(), llama31()}) {
    const auto params = parameters(m);
    // Each parameter saved as two pieces along its first dimension (as tp 2 saves a split one),
    // its master weights in f32 and its values in bf16; the master weights are exported.
    std::vector<checkpoint::NamedTensor> pieces;
    for (const auto& [name, t] : params) {
      const std::int64_t rows = t.shape()[0], half = rows / 2;
      using Range = std::pair<std::int64_t, std::int64_t>;
      for (const auto& [begin, size] : {Range{0, half}, Range{half, rows - half}}) {
        Shape start(t.shape().size(), 0);
        start[0] = begin;
        const Tensor part = t.narrow(0, begin, size).contiguous();
        pieces.push_back({checkpoint::encode_piece_name({"master", name, start, t.shape()}), part});
        pieces.push_back({checkpoint::encode_piece_name({"value", name, start, t.shape()}),
                          part.to(DType::bf16)});
      }
    }
    const std::string ck = tmp / ("ck" + std::to_string(cases++));
    const std::string user =
        fmt::format(R"({{"trainer_step": 3, "trainer_identity": "test", "trainer_model": {}}})",
                    train::checkpoint_model_json(m));
    checkpoint::save_checkpoint(ck, 3, pieces, user, *comm);
    const checkpoint::CheckpointInfo info = *checkpoint::latest_checkpoint(ck);
    const GptConfig back = train::checkpoint_model(info);
    REQUIRE(train::hf_config_json(back, {}) == train::hf_config_json(m, {}));
    train::export_hf_checkpoint(info, ck + "_hf", {});
    check_export(ck + "_hf", m, params, DType::f32);

    // A checkpoint without a parameter the model has is refused before anything is written.
    std::vector<checkpoint::NamedTensor> fewer;
    for (const checkpoint::NamedTensor& p : pieces) {
      if (p.name.find("/norm.weight@") == std::string::npos) fewer.push_back(p);
    }
    checkpoint::save_checkpoint(ck + "_fewer", 3, fewer, user, *comm);
    REQUIRE_THROWS_QUINTET(train::export_hf_checkpoint(
                               *checkpoint::latest_checkpoint(ck + "_fewer"), ck + "_fewer_hf", {}),
                           InvalidArgument, "has no parameter norm.weight");
    REQUIRE(!fs::exists(ck + "_fewer_hf"));
  }
  // A checkpoint without the model record (saved before it existed) is refused, saying so.
  checkpoint::save_checkpoint(tmp / "old", 1, {}, R"({"trainer_step": 1, "trainer_identity": "x"})",
                              *comm);
  REQUIRE_THROWS_QUINTET(
      train::export_hf_checkpoint(*checkpoint::latest_checkpoint(tmp / "old"), tmp / "old_hf", {}),
      InvalidArgument, "saved before checkpoints recorded their model");
}
