// config.json of a Hugging Face model into a GptConfig, and into a job (hf_checkpoint.hpp).
#include <fmt/format.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"

namespace quintet::train {

namespace {

using Json = nlohmann::json;

// Keys that transformers writes under either of two names for one value: a config class's
// attribute_map makes one name an alias of the other, and save_pretrained writes the one the
// class stores. The expert count is num_local_experts in Mixtral (num_experts an alias, both
// versions) and num_experts in transformers 4's Qwen3-MoE, num_local_experts in 5's (num_experts
// its alias there, so both versions load what the export writes, num_experts).
constexpr std::array<const char*, 2> kSpellings[] = {
    {"num_experts", "num_local_experts"},
};

// The values of one config.json, each read once with its file named in every error. A key of
// kSpellings is found under either name (the two, when both are given, must agree).
class ConfigReader {
 public:
  ConfigReader(std::string path, Json json) : path_(std::move(path)), j_(std::move(json)) {}
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return present(spelled(key)); }
  const Json& at(const char* key) const { return j_[spelled(key)]; }

  std::int64_t positive(const char* key) const {
    QUINTET_CHECK(has(key), "{}: no \"{}\"{}; a Hugging Face config.json of this model has one",
                  path_, key, other_spelling(key));
    const Json& v = at(key);
    QUINTET_CHECK(v.is_number_integer() && v.get<std::int64_t>() > 0,
                  "{}: \"{}\" is {}, expected a positive integer", path_, spelled(key), v.dump());
    return v.get<std::int64_t>();
  }
  std::int64_t positive(const char* key, std::int64_t fallback) const {
    return has(key) ? positive(key) : fallback;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    QUINTET_CHECK(v.is_number() && v.get<double>() > 0, "{}: \"{}\" is {}, expected a number > 0",
                  path_, spelled(key), v.dump());
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    QUINTET_CHECK(at(key).is_boolean(), "{}: \"{}\" is {}, expected true or false", path_,
                  spelled(key), at(key).dump());
    return at(key).get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    QUINTET_CHECK(at(key).is_string(), "{}: \"{}\" is {}, expected a string", path_, spelled(key),
                  at(key).dump());
    return at(key).get<std::string>();
  }
  // Refuses a value of key Quintet cannot run as Hugging Face does.
  void refuse_if(bool bad, const char* key, std::string_view why) const {
    QUINTET_CHECK(!bad, "{}: \"{}\" is {}: {}", path_, spelled(key),
                  has(key) ? at(key).dump() : "absent", why);
  }

 private:
  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  // key's row of kSpellings, or nullptr.
  static const std::array<const char*, 2>* spellings(const char* key) {
    for (const auto& names : kSpellings)
      if (std::string_view(key) == names[0] || std::string_view(key) == names[1]) return &names;
    return nullptr;
  }
  static const char* alias(const char* key) {
    const auto* names = spellings(key);
    if (names == nullptr) return nullptr;
    return std::string_view(key) == (*names)[0] ? (*names)[1] : (*names)[0];
  }
  // The name this file gives key's value: key, else its alias when the file has that.
  const char* spelled(const char* key) const {
    const char* other = alias(key);
    if (other == nullptr || !present(other)) return key;
    const auto& names = *spellings(key);
    QUINTET_CHECK(!present(key) || j_[key] == j_[other],
                  "{}: \"{}\" is {} and \"{}\" {}; they are one setting (transformers reads "
                  "either name), give one of them",
                  path_, names[0], j_[names[0]].dump(), names[1], j_[names[1]].dump());
    return present(key) ? key : other;
  }
  std::string other_spelling(const char* key) const {
    const char* other = alias(key);
    return other == nullptr ? "" : fmt::format(" (nor \"{}\")", other);
  }

  std::string path_;
  Json j_;
};

Json read_json(const std::string& path) {
  std::ifstream in(path);
  QUINTET_CHECK(in.good(),
                "{}: cannot be read; --init-from-hf takes a Hugging Face model directory (config"
                ".json beside model.safetensors or its shards)",
                path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    Json j = Json::parse(text.str());
    QUINTET_CHECK(j.is_object(), "{}: not a JSON object", path);
    return j;
  } catch (const Json::exception& e) {
    QUINTET_THROW(InvalidArgument, "{}: not valid JSON ({})", path, e.what());
  }
}

struct Architecture {
  const char* cls;
  const char* model_type;
  model::ModelFamily family;  // Qwen2 is Llama's structure with biases on q, k and v
};
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", model::ModelFamily::llama},
    {"Qwen2ForCausalLM", "qwen2", model::ModelFamily::llama},
    {"Qwen3ForCausalLM", "qwen3", model::ModelFamily::qwen3},
    {"MixtralForCausalLM", "mixtral", model::ModelFamily::mixtral},
    {"Qwen3MoeForCausalLM", "qwen3_moe", model::ModelFamily::qwen3_moe},
};

// The rope settings: rope_theta at the top (transformers 4) or in rope_parameters (5), and the
// scaling of rope_scaling / rope_parameters: "default" (none) or "llama3"; others are refused.
double read_rope(const ConfigReader& c, double fallback, nn::RopeScaling* scaling) {
  double theta = c.number("rope_theta", fallback);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!c.has(key)) continue;
    const Json& r = c.at(key);
    c.refuse_if(!r.is_object(), key, "expected an object or null");
    const Json type = r.contains("rope_type") ? r["rope_type"] : r.value("type", Json("default"));
    c.refuse_if(type != "default" && type != "llama3", key,
                "Quintet's RoPE scales frequencies as Llama 3 does (rope_type \"llama3\") or not "
                "at all (\"default\"), not otherwise");
    if (type == "llama3") {
      const auto number = [&](const char* field) {
        c.refuse_if(!r.contains(field) || !r[field].is_number(), key,
                    fmt::format("its {} must be a number", field));
        return r[field].get<double>();
      };
      scaling->factor = number("factor");
      scaling->low_freq_factor = number("low_freq_factor");
      scaling->high_freq_factor = number("high_freq_factor");
      scaling->original_max_position_embeddings =
          static_cast<std::int64_t>(number("original_max_position_embeddings"));
      nn::check_rope_scaling(*scaling, c.path().c_str());
    }
    if (r.contains("rope_theta") && !c.has("rope_theta")) {
      c.refuse_if(!r["rope_theta"].is_number() || r["rope_theta"].get<double>() <= 0, key,
                  "its rope_theta must be a number > 0");
      theta = r["rope_theta"].get<double>();
    }
  }
  return theta;
}

}  // namespace

HfModel read_hf_config(const std::string& dir) {
  HfModel hf;
  hf.dir = dir;
  hf.config_path = (std::filesystem::path(dir) / "config.json").string();
  const ConfigReader c(hf.config_path, read_json(hf.config_path));
  const std::string& path = c.path();
  // The architecture: architectures[0] when given, else model_type.
  hf.model_type = c.text("model_type", "");
  if (c.has("architectures")) {
    const Json& a = c.at("architectures");
    c.refuse_if(!a.is_array() || a.size() != 1 || !a[0].is_string(), "architectures",
                "expected one class name, [\"LlamaForCausalLM\"]");
    hf.architecture = a[0].get<std::string>();
  }
  const Architecture* arch = nullptr;
  for (const Architecture& a : kArchitectures) {
    if (hf.architecture.empty() ? hf.model_type == a.model_type : hf.architecture == a.cls)
      arch = &a;
  }
  QUINTET_CHECK(arch != nullptr,
                "{}: architecture \"{}\" (model_type \"{}\") is not one Quintet imports; it "
                "reads LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM "
                "and Qwen3MoeForCausalLM",
                path, hf.architecture, hf.model_type);
  if (hf.architecture.empty()) hf.architecture = arch->cls;
  QUINTET_CHECK(hf.model_type.empty() || hf.model_type == arch->model_type,
                "{}: model_type \"{}\" disagrees with architectures [\"{}\"] (model_type \"{}\")",
                path, hf.model_type, hf.architecture, arch->model_type);
  hf.model_type = arch->model_type;
  const model::ModelFamily family = arch->family;
  const bool qwen = family == model::ModelFamily::qwen3 || family == model::ModelFamily::qwen3_moe;
  const bool qwen2 = hf.model_type == "qwen2";
  const bool mixtral = family == model::ModelFamily::mixtral;

  model::GptConfig m;
  m.mlp = model::is_moe_family(family) ? model::MlpKind::moe : model::MlpKind::dense;
  m.set_family(family);
  m.hidden = c.positive("hidden_size");
  m.layers = c.positive("num_hidden_layers");
  m.heads = c.positive("num_attention_heads");
  m.kv_heads = c.positive("num_key_value_heads", m.heads);
  // Qwen3's config classes default head_dim to 128, Llama's and Mixtral's to hidden / heads.
  m.head_dim = qwen ? c.positive("head_dim") : c.positive("head_dim", 0);
  if (m.head_dim == 0) {
    QUINTET_CHECK(m.hidden % m.heads == 0,
                  "{}: hidden_size {} is not a multiple of num_attention_heads {} and there is no "
                  "head_dim",
                  path, m.hidden, m.heads);
    m.head_dim = m.hidden / m.heads;
  }
  m.vocab = c.positive("vocab_size");
  m.eps = static_cast<float>(c.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
  m.rope_theta = read_rope(c, mixtral ? 1e6 : 10000.0, &m.rope_scaling);
  m.tied_embeddings = c.flag("tie_word_embeddings", false);
  m.bias = c.flag("attention_bias", false);
  if (qwen2) {  // q, k and v always have biases, o_proj never (no attention_bias key)
    m.bias = true;
    m.proj_bias = false;
  }
  hf.max_position_embeddings = c.positive("max_position_embeddings", 0);
  c.refuse_if(c.text("hidden_act", "silu") != "silu", "hidden_act",
              "Quintet's SwiGLU gates with silu");
  c.refuse_if(c.flag("mlp_bias", false), "mlp_bias", "Quintet's SwiGLU MLP has no biases");
  // Sliding-window attention: Qwen3's use_sliding_window, transformers 5's layer_types; Mixtral's
  // sliding_window (a window no shorter than the sequence changes nothing: apply_hf_config).
  if (qwen || qwen2) {
    c.refuse_if(c.flag("use_sliding_window", false), "use_sliding_window",
                "Quintet's attention is causal over the whole sequence");
  } else if (c.has("sliding_window")) {
    hf.sliding_window = c.positive("sliding_window");
  }
  if (c.has("layer_types")) {
    const Json& t = c.at("layer_types");
    bool full = t.is_array();
    for (const Json& x : t) full = full && x == "full_attention";
    c.refuse_if(!full, "layer_types", "every layer must be \"full_attention\"");
  }
  if (mixtral) {
    m.ffn_hidden = c.positive("intermediate_size");
    m.moe.router.experts = c.positive("num_local_experts");
    m.moe.router.renormalize = true;
    c.refuse_if(c.has("router_jitter_noise") && c.at("router_jitter_noise") != 0,
                "router_jitter_noise", "Quintet's router adds no noise (0 only)");
  } else if (family == model::ModelFamily::qwen3_moe) {
    m.moe.expert_ffn = c.positive("moe_intermediate_size");
    m.moe.router.experts = c.positive("num_experts");
    m.moe.router.renormalize = c.flag("norm_topk_prob", false);
    // The dense layers: those mlp_only_layers lists and those decoder_sparse_step skips.
    HfSparseLayers sparse{c.positive("decoder_sparse_step", 1), {}};
    if (c.has("mlp_only_layers")) {
      const Json& only = c.at("mlp_only_layers");
      c.refuse_if(!only.is_array(), "mlp_only_layers", "expected a list of layer indices");
      for (const Json& l : only) {
        c.refuse_if(!l.is_number_integer() || l.get<std::int64_t>() < 0 ||
                        l.get<std::int64_t>() >= m.layers,
                    "mlp_only_layers",
                    fmt::format("each entry must be a layer index, 0 .. {} (num_hidden_layers {})",
                                m.layers - 1, m.layers));
        sparse.mlp_only_layers.push_back(l.get<std::int64_t>());
      }
    }
    m.moe.dense_layers = hf_dense_layers(m.layers, sparse);
    QUINTET_CHECK(static_cast<std::int64_t>(m.moe.dense_layers.size()) < m.layers,
                  "{}: \"decoder_sparse_step\" {} and \"mlp_only_layers\" {} leave none of the {} "
                  "layers sparse; Quintet's MoE models hold one MoE layer at least",
                  path, sparse.decoder_sparse_step,
                  c.has("mlp_only_layers") ? c.at("mlp_only_layers").dump() : "absent", m.layers);
    // Its dense layers' MLP width (needed only when there are some).
    m.ffn_hidden = m.moe.dense_layers.empty() ? c.positive("intermediate_size", 0)
                                              : c.positive("intermediate_size");
  } else {
    m.ffn_hidden = c.positive("intermediate_size");
  }
  if (m.mlp == model::MlpKind::moe) {
    const std::int64_t k = c.positive("num_experts_per_tok");
    c.refuse_if(k > 8 || k > m.moe.router.experts, "num_experts_per_tok",
                "Quintet routes each token to at most 8 experts, and no more than there are");
    m.moe.router.top_k = static_cast<int>(k);
    m.moe.router.score = expert::RouterScore::softmax;
  }
  hf.model = m;
  hf.naming = hf_naming(family);
  return hf;
}

void apply_hf_config(const HfModel& hf, JobConfig* job,
                     const std::function<bool(std::string_view)>& given) {
  const model::GptConfig& h = hf.model;
  const model::GptConfig& was = job->model;
  const bool moe = h.mlp == model::MlpKind::moe;
  QUINTET_CHECK(moe == (was.mlp == model::MlpKind::moe),
                "{}: {} is {} model, and this job is {}; {}", hf.config_path, hf.architecture,
                moe ? "an MoE" : "a dense", moe ? "dense" : "an MoE",
                moe ? "train it with the MoE trainer (05_moe_train, JobConfig::moe_preset())"
                    : "train it with the dense trainer (04_gpt_train)");
  model::GptConfig m = was;
  m.set_family(h.family);
  // What config.json has no say on stays the job's (set_family resets it to the family's).
  m.moe.router.capacity_factor = was.moe.router.capacity_factor;
  m.moe.router.bias_rate = was.moe.router.bias_rate;
  m.layers = h.layers;
  m.hidden = h.hidden;
  m.heads = h.heads;
  m.kv_heads = h.kv_heads;
  m.head_dim = h.head_dim;
  m.ffn_hidden = h.ffn_hidden;
  m.vocab = h.vocab;
  m.eps = h.eps;
  m.rope_theta = h.rope_theta;
  m.rope_scaling = h.rope_scaling;
  m.tied_embeddings = h.tied_embeddings;
  m.bias = h.bias;
  m.proj_bias = h.proj_bias;
  if (moe) {
    m.moe.router.experts = h.moe.router.experts;
    m.moe.router.top_k = h.moe.router.top_k;
    m.moe.router.renormalize = h.moe.router.renormalize;
    m.moe.router.score = h.moe.router.score;
    m.moe.expert_ffn = h.moe.expert_ffn;
    m.moe.every = 1;
    m.moe.dense_layers = h.moe.dense_layers;
  }
  // A flag given on the command line (or in the job file) must agree with config.json.
  struct Setting {
    const char* flag;
    const char* key;  // config.json's
    std::string job, file;
  };
  const auto str = [](const auto& v) { return fmt::format("{}", v); };
  std::vector<Setting> settings{
      {"arch", "architectures", std::string(model::model_family_name(was.family)),
       std::string(model::model_family_name(m.family))},
      {"layers", "num_hidden_layers", str(was.layers), str(m.layers)},
      {"hidden", "hidden_size", str(was.hidden), str(m.hidden)},
      {"heads", "num_attention_heads", str(was.heads), str(m.heads)},
      {"kv-heads", "num_key_value_heads", str(was.kv_head_count()), str(m.kv_heads)},
      {"head-dim", "head_dim", str(was.head_size()), str(m.head_dim)},
      {"ffn-hidden", "intermediate_size", str(was.mlp_width()), str(m.mlp_width())},
      {"vocab", "vocab_size", str(was.vocab), str(m.vocab)},
      {"rope-theta", "rope_theta", str(was.rope_theta), str(m.rope_theta)},
      {"tied-embeddings", "tie_word_embeddings", str(was.tied_embeddings), str(m.tied_embeddings)},
      {"no-bias", "attention_bias", str(!was.bias), str(!m.bias)},
      {"qk-norm", "architectures", str(was.qk_norm), str(m.qk_norm)},
      {"norm", "architectures", str(static_cast<int>(was.norm)), str(static_cast<int>(m.norm))},
      {"activation", "architectures", str(static_cast<int>(was.activation)),
       str(static_cast<int>(m.activation))},
      {"positions", "architectures", was.rope ? "rope" : "learned", m.rope ? "rope" : "learned"},
  };
  if (moe) {
    const expert::RouterConfig &a = was.moe.router, &b = m.moe.router;
    settings.push_back(
        {"experts", h.family == model::ModelFamily::mixtral ? "num_local_experts" : "num_experts",
         str(a.experts), str(b.experts)});
    settings.push_back({"top-k", "num_experts_per_tok", str(a.top_k), str(b.top_k)});
    settings.push_back({"router", "architectures",
                        a.score == expert::RouterScore::softmax ? "softmax" : "sigmoid",
                        "softmax"});
    settings.push_back(
        {"expert-ffn", "moe_intermediate_size", str(was.expert_width()), str(m.expert_width())});
    settings.push_back({"moe-every", "decoder_sparse_step", str(was.moe.every), "1"});
    settings.push_back({"dense-layers", "mlp_only_layers",
                        model::layer_list_text(was.moe.dense_layers),
                        model::layer_list_text(m.moe.dense_layers)});
  }
  for (const Setting& s : settings) {
    QUINTET_CHECK(!given || !given(s.flag) || s.job == s.file,
                  "--{} {} contradicts {}: its \"{}\" makes it {}; drop --{} (--init-from-hf "
                  "takes the model from config.json)",
                  s.flag, s.job, hf.config_path, s.key, s.file, s.flag);
  }
  QUINTET_CHECK(!moe || was.moe.shared_experts == 0,
                "--shared-experts {}: {} has no shared experts", was.moe.shared_experts,
                hf.config_path);
  QUINTET_CHECK(hf.max_position_embeddings == 0 || m.seq_len <= hf.max_position_embeddings,
                "--seq-len {} is longer than {}'s max_position_embeddings {}", m.seq_len,
                hf.config_path, hf.max_position_embeddings);
  QUINTET_CHECK(hf.sliding_window == 0 || m.seq_len <= hf.sliding_window,
                "--seq-len {} is longer than {}'s sliding_window {}: Quintet's attention has no "
                "window; train on sequences of at most {} tokens",
                m.seq_len, hf.config_path, hf.sliding_window, hf.sliding_window);
  job->model = m;
}

}  // namespace quintet::train
