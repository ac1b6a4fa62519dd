// train::JobConfig: a job file and the flags that override it, every flag of --help reaching the
// config, the jobs the trainers refuse, refused by validate() with a message naming the flag, and
// the validation windows an evaluation reads (validation_batches).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "quintet/parallel/train/evaluate.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"
#include "quintet/parallel/train/job_config.hpp"
#include "support/catch.hpp"

using namespace quintet;
using train::JobConfig;

namespace {

// parse_job_args over args (after the program name), the runtime's flags taken out first as a
// trainer's main does; the exit status, or nullopt to go on.
std::optional<int> parse(JobConfig* job, std::vector<std::string> args) {
  args.insert(args.begin(), "trainer");
  return train::parse_job_args(RuntimeConfig::from({}, args), "test trainer", job);
}

JobConfig parsed(JobConfig job, const std::vector<std::string>& args) {
  const std::optional<int> exit = parse(&job, args);
  INFO("flags rejected");
  REQUIRE_FALSE(exit.has_value());
  return job;
}

// The long flags --help lists, in order.
std::vector<std::string> help_flags(const JobConfig& defaults) {
  std::vector<std::string> out;
  const std::string help = train::job_help(defaults, "test trainer");
  const std::regex line(R"(^\s+(?:-\w,)?(--[a-z][a-z0-9-]*))");
  std::istringstream in(help);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) out.push_back(m[1]);
  }
  return out;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

// A Hugging Face model directory holding config.json only (what parse_job_args reads).
std::string hf_dir(const std::string& name, const std::string& config) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config;
  return dir.string();
}

const char* kLlamaConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 6, "intermediate_size": 40, "vocab_size": 320, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "tie_word_embeddings": true, "max_position_embeddings": 4096})";
const char* kMixtralConfig = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "intermediate_size": 20, "vocab_size": 320, "num_local_experts": 4, "num_experts_per_tok": 1,
  "router_jitter_noise": 0.0, "sliding_window": null})";

}  // namespace

TEST_CASE("job config: a job file, overridden by the flags given beside it", "[train]") {
  const std::string path = write_file("quintet_job_config_test.json", R"({
    "layers": 4, "hidden": 96, "heads": 6, "tp": 2, "dp": 2, "lr-schedule": "wsd",
    "sp": true, "no-progress": true, "steps": 30, "lr": 0.002, "data-dir": "here"
  })");
  const JobConfig job =
      parsed(JobConfig{}, {"--config", path, "--steps", "50", "--hidden", "120", "--zero", "1"});
  CHECK(job.model.layers == 4);
  CHECK(job.model.hidden == 120);  // the flag over the file
  CHECK(job.model.heads == 6);
  CHECK(job.parallel.tp == 2);
  CHECK(job.parallel.dp == 2);
  CHECK(job.training.lr_schedule == nn::LrSchedule::Kind::wsd);
  CHECK(job.model.sequence_parallel);
  CHECK_FALSE(job.observe.progress);
  CHECK(job.training.steps == 50);
  CHECK(job.training.lr == 0.002f);
  CHECK(job.training.zero == 1);
  CHECK(job.data.dir == "here");
  CHECK(job.model.vocab == JobConfig{}.model.vocab);  // neither: the default
  job.validate(4);

  JobConfig bad;
  // An unknown key, a runtime setting, a nested object, broken JSON, not an object, a list, a
  // missing file: exit 2, rank 0 printing what is wrong.
  for (const char* text : {R"({"layer": 4})", R"({"seed": 7})", R"({"model": {"layers": 2}})",
                           R"({"layers": 4,)", R"([4])", R"({"layers": [4]})", R"({"ep": 2})"}) {
    INFO(text);
    CHECK(parse(&bad, {"--config", write_file("quintet_job_config_bad.json", text)}) == 2);
  }
  CHECK(parse(&bad, {"--config", "/no/such/job.json"}) == 2);
  std::filesystem::remove(path);
  // An MoE key is the MoE trainer's (the dense one refuses it above).
  const std::string moe = write_file("quintet_job_config_moe.json", R"({"ep": 2})");
  CHECK(parsed(JobConfig::moe_preset(), {"--config", moe}).parallel.ep == 2);
  std::filesystem::remove(moe);
}

TEST_CASE("job config: the runtime's seed is the job's, --help exits 0, a bad flag 2", "[train]") {
  JobConfig job;
  REQUIRE_FALSE(train::parse_job_args(
                    RuntimeConfig::from({}, {"trainer", "--seed", "77", "--steps", "3"}), "t", &job)
                    .has_value());
  CHECK(job.training.seed == 77);
  CHECK(job.training.steps == 3);
  CHECK(parse(&job, {"--help"}) == 0);
  CHECK(parse(&job, {"--no-such-flag"}) == 2);
  CHECK(parse(&job, {"--layers", "two"}) == 2);
  // A value the library's parse function refuses, named by it.
  CHECK(parse(&job, {"--schedule", "2f2b"}) == 2);
  CHECK(parse(&job, {"--recompute", "some"}) == 2);
  // The dense trainer has no MoE flags.
  CHECK(parse(&job, {"--experts", "4"}) == 2);
}

TEST_CASE("job config: the built-in dataset lives in one place per machine", "[train]") {
  using Env = std::map<std::string, std::string>;
  const auto dir_of = [](const Env& env) {
    return train::default_dataset_dir(RuntimeConfig::from(env, {"trainer"}));
  };
  CHECK(dir_of({{"HOME", "/home/u"}}) == "/home/u/.cache/quintet/data");
  CHECK(dir_of({{"HOME", "/home/u"}, {"XDG_CACHE_HOME", "/c"}}) == "/c/quintet/data");
  CHECK(dir_of({{"HOME", "/home/u"}, {"QUINTET_DATA_DIR", "/shared/d"}}) == "/shared/d");
  CHECK(dir_of({}) == "data");
  // A job uses it unless --data-dir (or code) says otherwise.
  const RuntimeConfig shared = RuntimeConfig::from({{"QUINTET_DATA_DIR", "/shared/d"}}, {"t"});
  CHECK(JobConfig{}.builtin_dataset_dir(shared) == "/shared/d");
  CHECK(parsed(JobConfig{}, {"--data-dir", "mine"}).builtin_dataset_dir(shared) == "mine");
}

TEST_CASE("job config: every flag --help lists reaches the config", "[train]") {
  // A value other than the default for each flag ("" for a switch). A flag --help lists that is
  // not here fails the test: add it, with the field it sets.
  const std::map<std::string, std::string> values = {{"--layers", "3"},
                                                     {"--hidden", "96"},
                                                     {"--heads", "8"},
                                                     {"--vocab", "300"},
                                                     {"--seq-len", "64"},
                                                     {"--kv-heads", "2"},
                                                     {"--head-dim", "32"},
                                                     {"--ffn-hidden", "256"},
                                                     {"--norm", "rmsnorm"},
                                                     {"--activation", "swiglu"},
                                                     {"--positions", "rope"},
                                                     {"--rope-theta", "500000"},
                                                     {"--qk-norm", ""},
                                                     {"--no-bias", ""},
                                                     {"--recompute", "full"},
                                                     {"--fp8", "hybrid"},
                                                     {"--fp8-scaling", "delayed"},
                                                     {"--fp8-amax-history", "8"},
                                                     {"--fp8-lm-head", ""},
                                                     {"--tied-embeddings", ""},
                                                     {"--micro-batch", "2"},
                                                     {"--global-batch", "32"},
                                                     {"--tp", "2"},
                                                     {"--dp", "2"},
                                                     {"--cp", "2"},
                                                     {"--cp-kind", "ulysses"},
                                                     {"--pp", "2"},
                                                     {"--vpp", "2"},
                                                     {"--schedule", "gpipe"},
                                                     {"--sp", ""},
                                                     {"--tp-overlap", ""},
                                                     {"--tp-overlap-chunks", "4"},
                                                     {"--zero", "1"},
                                                     {"--lr", "0.002"},
                                                     {"--warmup", "3"},
                                                     {"--min-lr", "0.0002"},
                                                     {"--lr-schedule", "wsd"},
                                                     {"--decay-fraction", "0.5"},
                                                     {"--weight-decay", "0.05"},
                                                     {"--clip", "0.5"},
                                                     {"--steps", "50"},
                                                     {"--stop-at", "5"},
                                                     {"--data", "shards/*.bin"},
                                                     {"--data-dir", "elsewhere"},
                                                     {"--synthetic-order", "1"},
                                                     {"--loader-threads", "3"},
                                                     {"--val-data", "val/*.bin"},
                                                     {"--val-every", "5"},
                                                     {"--val-batches", "4"},
                                                     {"--eval-only", ""},
                                                     {"--loader-delay-ms", "40"},
                                                     {"--save", "ckpt"},
                                                     {"--async-save", ""},
                                                     {"--save-every", "10"},
                                                     {"--keep-last", "3"},
                                                     {"--resume", "r"},
                                                     {"--resume-if-exists", "r2"},
                                                     {"--export-hf", "hf_out"},
                                                     {"--export-hf-every", "10"},
                                                     {"--export-dtype", "bf16"},
                                                     {"--bucket-mb", "5"},
                                                     {"--no-overlap", ""},
                                                     {"--check-batches", ""},
                                                     {"--bench", ""},
                                                     {"--bench-skip", "2"},
                                                     {"--experts", "16"},
                                                     {"--top-k", "1"},
                                                     {"--ep", "2"},
                                                     {"--etp", "1"},
                                                     {"--capacity-factor", "1.5"},
                                                     {"--router", "sigmoid"},
                                                     {"--aux-loss-coeff", "0.02"},
                                                     {"--z-loss-coeff", "0.002"},
                                                     {"--aux-free-bias-rate", "0.001"},
                                                     {"--shared-experts", "1"},
                                                     {"--expert-ffn", "256"},
                                                     {"--moe-every", "2"},
                                                     {"--dense-layers", "1"},
                                                     {"--moe-chunks", "4"},
                                                     {"--trace", "traces"},
                                                     {"--trace-steps", "1:2"}};
  // The help and the job file are tested above; the output switches are checked by their
  // fields below. The runtime's flags (those RuntimeConfig::from_args takes out, or refuses the
  // value of) are listed for --help only and read by the runtime (--seed is tested above).
  const auto elsewhere = [](const std::string& flag) {
    if (flag == "--help" || flag == "--config") return true;
    try {
      const auto left = RuntimeConfig::from({}, {"trainer", flag, "1"}).remaining_args;
      return std::find(left.begin(), left.end(), flag) == left.end();
    } catch (const Error&) {
      return true;
    }
  };
  for (const JobConfig& defaults : {JobConfig{}, JobConfig::moe_preset()}) {
    const std::vector<std::string> flags = help_flags(defaults);
    CHECK(flags.size() > 50);
    const auto before = defaults.settings();
    for (const std::string& flag : flags) {
      INFO(flag);
      if (elsewhere(flag)) continue;
      if (flag == "--json") {
        CHECK(parsed(defaults, {flag}).observe.json);
        continue;
      }
      if (flag == "--no-progress") {
        CHECK_FALSE(parsed(defaults, {flag}).observe.progress);
        continue;
      }
      if (flag == "--arch") {  // a family: the flags of the structure it sets change with it
        const bool moe = defaults.model.mlp == model::MlpKind::moe;
        const auto after = parsed(defaults, {flag, moe ? "qwen3-moe" : "qwen3"}).settings();
        REQUIRE(after.size() == before.size());
        std::vector<std::string> changed;
        for (std::size_t i = 0; i < after.size(); ++i) {
          if (after[i] != before[i]) changed.push_back(after[i].first);
        }
        std::vector<std::string> want = {"--arch",       "--norm",    "--activation", "--positions",
                                         "--rope-theta", "--qk-norm", "--no-bias"};
        if (moe) {  // and the MoE shape: 128 experts of their own width, top-8
          for (const char* f : {"--experts", "--top-k", "--expert-ffn"}) want.emplace_back(f);
        }
        CHECK(changed == want);
        continue;
      }
      if (flag == "--init-from-hf") {  // the model becomes config.json's (tested below)
        const bool moe = defaults.model.mlp == model::MlpKind::moe;
        const std::string dir = hf_dir(moe ? "quintet_hf_mixtral" : "quintet_hf_llama",
                                       moe ? kMixtralConfig : kLlamaConfig);
        const JobConfig job = parsed(defaults, {flag, dir});
        CHECK(job.checkpoint.init_from_hf == dir);
        CHECK(job.model.hidden == 24);
        continue;
      }
      const auto v = values.find(flag);
      REQUIRE(v != values.end());
      std::vector<std::string> args = {flag};
      if (!v->second.empty()) args.push_back(v->second);
      // Exactly this flag's setting changed: the flag reaches its own field, and only it.
      const auto after = parsed(defaults, args).settings();
      REQUIRE(after.size() == before.size());
      int changed = 0;
      for (std::size_t i = 0; i < after.size(); ++i) {
        if (after[i] == before[i]) continue;
        ++changed;
        CHECK(after[i].first == flag);
      }
      CHECK(changed == 1);
    }
  }
  // The MoE trainer's --top-k decides the renormalization of the router's weights.
  CHECK_FALSE(parsed(JobConfig::moe_preset(), {"--top-k", "1"}).model.moe.router.renormalize);
  CHECK(parsed(JobConfig::moe_preset(), {"--top-k", "3"}).model.moe.router.renormalize);
}

TEST_CASE("job config: --init-from-hf takes the model from config.json, refusing contradictions",
          "[train]") {
  const std::string llama = hf_dir("quintet_hf_llama", kLlamaConfig);
  const JobConfig job = parsed(JobConfig{}, {"--init-from-hf", llama, "--seq-len", "64"});
  const model::GptConfig& m = job.model;
  CHECK(m.family == model::ModelFamily::llama);
  CHECK((m.layers == 3 && m.hidden == 24 && m.heads == 4 && m.kv_heads == 2 && m.head_dim == 6));
  CHECK((m.ffn_hidden == 40 && m.vocab == 320 && m.tied_embeddings && !m.bias && m.rope));
  CHECK((m.eps == 1e-5f && m.rope_theta == 500000.0 && m.seq_len == 64));
  CHECK(m.norm == nn::NormKind::rmsnorm);
  CHECK(m.activation == nn::Activation::swiglu);
  // Flags that agree with config.json are fine; those that do not are refused.
  CHECK(parsed(JobConfig{},
               {"--init-from-hf", llama, "--hidden", "24", "--arch", "llama", "--no-bias"})
            .model.hidden == 24);
  for (const std::vector<std::string> flags : {std::vector<std::string>{"--hidden", "32"},
                                               {"--arch", "qwen3"},
                                               {"--kv-heads", "4"},
                                               {"--qk-norm"},
                                               {"--seq-len", "8192"},
                                               {"--tied-embeddings=false"}}) {
    INFO(flags.front());
    JobConfig bad;
    std::vector<std::string> args{"--init-from-hf", llama};
    args.insert(args.end(), flags.begin(), flags.end());
    CHECK(parse(&bad, args) == 2);
  }
  // An MoE model needs the MoE trainer's job, and the reverse.
  const std::string mixtral = hf_dir("quintet_hf_mixtral", kMixtralConfig);
  JobConfig dense;
  CHECK(parse(&dense, {"--init-from-hf", mixtral}) == 2);
  JobConfig moe = JobConfig::moe_preset();
  CHECK(parse(&moe, {"--init-from-hf", llama}) == 2);
  const JobConfig mx = parsed(JobConfig::moe_preset(), {"--init-from-hf", mixtral});
  CHECK((mx.model.moe.router.experts == 4 && mx.model.moe.router.top_k == 1));
  CHECK(mx.model.moe.router.renormalize);  // Mixtral renormalizes, even over one expert
  CHECK(mx.model.family == model::ModelFamily::mixtral);
  CHECK(mx.model.eps == 1e-5f);
  CHECK(mx.model.rope_theta == 1e6);  // MixtralConfig's default
  // No directory, no --resume beside it.
  JobConfig missing;
  CHECK(parse(&missing, {"--init-from-hf", "/no/such/hf/model"}) == 2);
  const JobConfig both = parsed(JobConfig{}, {"--init-from-hf", llama, "--resume", "ckpt",
                                              "--seq-len", "64", "--vocab", "320"});
  REQUIRE_THROWS_QUINTET(both.validate(1), InvalidArgument, "give one of them");
}

// config.json as transformers 4 and as transformers 5 writes it: 5 moves rope_theta (and
// rope_scaling) into rope_parameters, writes dtype for torch_dtype, and Qwen3-MoE's expert count
// under num_local_experts (num_experts is its alias there). Each pair imports to one model.
TEST_CASE("job config: --init-from-hf reads config.json as transformers 4 and 5 write it",
          "[train]") {
  const nlohmann::json qwen3_moe = nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 20,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
    "intermediate_size": 28, "moe_intermediate_size": 12, "vocab_size": 48,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "num_experts_per_tok": 2,
    "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "use_sliding_window": false, "sliding_window": null})");
  const nlohmann::json llama31 = nlohmann::json::parse(kLlamaConfig);
  const nlohmann::json llama3_rope = {{"rope_type", "llama3"},
                                      {"factor", 8.0},
                                      {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0},
                                      {"original_max_position_embeddings", 64}};
  // A model's config.json patched with transformers 4's keys and with 5's (merge_patch: null
  // removes a key), its rope_theta, and whether the MoE trainer takes it.
  struct Pair {
    const char* name;
    nlohmann::json base, v4, v5;
    double theta;
    bool moe;
  };
  nlohmann::json rope5 = llama3_rope;
  rope5["rope_theta"] = 500000.0;
  const Pair pairs[] = {
      {"qwen3_moe",
       qwen3_moe,
       {{"num_experts", 4}, {"rope_theta", 1000000.0}, {"torch_dtype", "float32"}},
       {{"num_local_experts", 4},
        {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
        {"dtype", "float32"}},
       1e6,
       true},
      {"mixtral",
       nlohmann::json::parse(kMixtralConfig),
       {{"rope_theta", 100000.0}, {"rope_scaling", nullptr}},
       {{"rope_theta", nullptr},  // removed
        {"rope_parameters", {{"rope_theta", 100000.0}, {"rope_type", "default"}}}},
       1e5,
       true},
      // Mixtral's alias: num_experts for num_local_experts.
      {"mixtral_alias",
       nlohmann::json::parse(kMixtralConfig),
       nlohmann::json::object(),
       {{"num_local_experts", nullptr}, {"num_experts", 4}},
       1e6,
       true},
      {"llama31",
       llama31,
       {{"rope_scaling", llama3_rope}},
       {{"rope_theta", nullptr}, {"rope_parameters", rope5}},
       500000.0,
       false},
  };
  // The job's settings but the directory it was given.
  const auto model_of = [](const nlohmann::json& config, const std::string& dir, bool moe) {
    const JobConfig job = parsed(moe ? JobConfig::moe_preset() : JobConfig{},
                                 {"--init-from-hf", hf_dir(dir, config.dump()), "--seq-len", "64"});
    auto settings = job.settings();
    settings.erase(std::remove_if(settings.begin(), settings.end(),
                                  [](const auto& kv) { return kv.first == "--init-from-hf"; }),
                   settings.end());
    return std::make_pair(job.model, settings);
  };
  for (const Pair& p : pairs) {
    INFO(p.name);
    nlohmann::json v4 = p.base, v5 = p.base;
    v4.merge_patch(p.v4);
    v5.merge_patch(p.v5);
    const auto [m4, s4] = model_of(v4, std::string("quintet_hf_v4_") + p.name, p.moe);
    const auto [m5, s5] = model_of(v5, std::string("quintet_hf_v5_") + p.name, p.moe);
    REQUIRE(s4.size() == s5.size());
    for (std::size_t i = 0; i < s4.size(); ++i) {
      INFO(s4[i].first);
      CHECK(s4[i] == s5[i]);
    }
    CHECK((m4.rope_theta == p.theta && m5.rope_theta == p.theta));
    CHECK((m4.rope_scaling.factor == m5.rope_scaling.factor &&
           m4.rope_scaling.low_freq_factor == m5.rope_scaling.low_freq_factor &&
           m4.rope_scaling.high_freq_factor == m5.rope_scaling.high_freq_factor &&
           m4.rope_scaling.original_max_position_embeddings ==
               m5.rope_scaling.original_max_position_embeddings));
    if (p.moe) {
      CHECK((m4.moe.router.experts == 4 && m5.moe.router.experts == 4));
    } else {
      CHECK((m5.rope_scaling.factor == 8.0 &&
             m5.rope_scaling.original_max_position_embeddings == 64));
    }
  }
  // Neither name of the expert count, or both with two values: refused, naming both.
  for (const char* family : {"qwen3_moe", "mixtral"}) {
    INFO(family);
    nlohmann::json none =
        std::string(family) == "mixtral" ? nlohmann::json::parse(kMixtralConfig) : qwen3_moe;
    none.erase("num_local_experts");
    const std::string dir = hf_dir(std::string("quintet_hf_no_experts_") + family, none.dump());
    REQUIRE_THROWS_QUINTET(train::read_hf_config(dir), InvalidArgument,
                           std::string(family) == "mixtral"
                               ? R"(no "num_local_experts" (nor "num_experts"); a Hugging Face)"
                               : R"(no "num_experts" (nor "num_local_experts"); a Hugging Face)");
    nlohmann::json both = none;
    both["num_experts"] = 4;
    both["num_local_experts"] = 8;
    REQUIRE_THROWS_QUINTET(
        train::read_hf_config(hf_dir(std::string("quintet_hf_two_experts_") + family, both.dump())),
        InvalidArgument, R"("num_experts" is 4 and "num_local_experts" 8; they are one setting)");
    both["num_local_experts"] = 4;  // the same value twice is one value
    CHECK(
        train::read_hf_config(hf_dir(std::string("quintet_hf_two_experts_") + family, both.dump()))
            .model.moe.router.experts == 4);
  }
}

TEST_CASE("job config: --arch sets a family's structure, the flags beside it override it",
          "[train]") {
  const JobConfig llama = parsed(JobConfig{}, {"--arch", "llama", "--kv-heads", "2"});
  CHECK(llama.model.family == model::ModelFamily::llama);
  const model::GptConfig want = model::GptConfig::llama(JobConfig{}.model);
  CHECK(llama.model.norm == want.norm);
  CHECK(llama.model.activation == want.activation);
  CHECK((llama.model.rope && !llama.model.learned_positions && !llama.model.bias));
  CHECK(llama.model.rope_theta == want.rope_theta);
  CHECK(llama.model.eps == want.eps);
  CHECK(llama.model.kv_heads == 2);
  llama.validate(1);
  // The explicit flags win wherever they stand, the job file's too.
  const JobConfig mixed =
      parsed(JobConfig{}, {"--norm", "layernorm", "--positions", "learned", "--arch", "qwen3",
                           "--rope-theta", "10000", "--activation", "gelu"});
  CHECK(mixed.model.family == model::ModelFamily::qwen3);
  CHECK(mixed.model.norm == nn::NormKind::layernorm);
  CHECK((mixed.model.learned_positions && !mixed.model.rope));
  CHECK(mixed.model.activation == nn::Activation::gelu);
  CHECK(mixed.model.rope_theta == 10000.0);
  CHECK((mixed.model.qk_norm && !mixed.model.bias));  // the family's
  const std::string path =
      write_file("quintet_job_config_arch.json", R"({"arch": "qwen3", "positions": "learned"})");
  const JobConfig filed = parsed(JobConfig{}, {"--config", path, "--no-bias"});
  CHECK((filed.model.qk_norm && filed.model.learned_positions && !filed.model.rope));
  std::filesystem::remove(path);
  // --arch gpt2 is today's model; the MoE trainer takes the MoE families.
  CHECK(parsed(JobConfig{}, {"--arch", "gpt2"}).settings() == JobConfig{}.settings());
  const JobConfig mixtral = parsed(JobConfig::moe_preset(), {"--arch", "mixtral"});
  CHECK((mixtral.model.mlp == model::MlpKind::moe &&
         mixtral.model.activation == nn::Activation::swiglu && mixtral.model.rope));
  mixtral.validate(1);
}

TEST_CASE(
    "job config: the MoE families' --arch sets the MoE shape the API's constructors do, "
    "the MoE flags beside it override it",
    "[train]") {
  const JobConfig preset = JobConfig::moe_preset();
  // The same model as GptConfig::mixtral / qwen3_moe over the sizes given, --hidden included
  // wherever it stands (an expert's width in Qwen3-MoE is 3/8 of it).
  const auto same_moe = [](const model::GptConfig& a, const model::GptConfig& b) {
    const expert::RouterConfig &ra = a.moe.router, &rb = b.moe.router;
    return a.mlp == b.mlp && ra.experts == rb.experts && ra.top_k == rb.top_k &&
           ra.score == rb.score && ra.renormalize == rb.renormalize &&
           ra.capacity_factor == rb.capacity_factor && ra.bias_rate == rb.bias_rate &&
           a.moe.expert_ffn == b.moe.expert_ffn && a.moe.shared_experts == b.moe.shared_experts &&
           a.moe.every == b.moe.every && a.expert_width() == b.expert_width() &&
           a.qk_norm == b.qk_norm && a.norm == b.norm && a.activation == b.activation &&
           a.rope == b.rope && a.bias == b.bias;
  };
  model::GptConfig sizes = preset.model;
  sizes.hidden = 64;
  const JobConfig mixtral = parsed(preset, {"--hidden", "64", "--arch", "mixtral"});
  CHECK(same_moe(mixtral.model, model::GptConfig::mixtral(sizes)));
  CHECK((mixtral.model.moe.router.experts == 8 && mixtral.model.moe.router.top_k == 2 &&
         mixtral.model.expert_width() == 256));
  const JobConfig qwen3_moe = parsed(preset, {"--arch", "qwen3-moe", "--hidden", "64"});
  CHECK(same_moe(qwen3_moe.model, model::GptConfig::qwen3_moe(sizes)));
  CHECK((qwen3_moe.model.moe.router.experts == 128 && qwen3_moe.model.moe.router.top_k == 8 &&
         qwen3_moe.model.moe.expert_ffn == 24 && qwen3_moe.model.moe.router.renormalize));
  qwen3_moe.validate(1);
  // The training's loss coefficients stay the trainer's.
  CHECK((qwen3_moe.model.moe.router.aux_loss_coeff == preset.model.moe.router.aux_loss_coeff &&
         qwen3_moe.model.moe.router.z_loss_coeff == preset.model.moe.router.z_loss_coeff));
  // The MoE flags win wherever they stand, a job file's too.
  const JobConfig custom = parsed(
      preset, {"--experts", "16", "--expert-ffn", "40", "--arch", "qwen3-moe", "--top-k", "1",
               "--shared-experts", "1", "--capacity-factor", "1.5", "--moe-every", "2"});
  const expert::RouterConfig& r = custom.model.moe.router;
  CHECK((r.experts == 16 && r.top_k == 1 && !r.renormalize && r.capacity_factor == 1.5f));
  CHECK((custom.model.moe.expert_ffn == 40 && custom.model.moe.shared_experts == 1 &&
         custom.model.moe.every == 2 && custom.model.qk_norm));
  const std::string path =
      write_file("quintet_job_config_moe_arch.json", R"({"experts": 4, "arch": "mixtral"})");
  const JobConfig filed = parsed(preset, {"--config", path, "--top-k", "3"});
  CHECK((filed.model.moe.router.experts == 4 && filed.model.moe.router.top_k == 3));
  std::filesystem::remove(path);
}

TEST_CASE("job config: the jobs the trainers refuse, refused before any communication", "[train]") {
  // The settings of the trainer tests (tests/example/gpt_train_test.sh), then each bad change.
  const std::vector<std::string> base = {"--layers",      "2", "--hidden",       "64",
                                         "--heads",       "4", "--seq-len",      "32",
                                         "--micro-batch", "2", "--global-batch", "12"};
  const auto refused = [&](const JobConfig& preset, int world, std::vector<std::string> flags,
                           const std::string& message) {
    flags.insert(flags.begin(), base.begin(), base.end());
    JobConfig job = preset;
    const std::optional<int> exit = parse(&job, flags);
    INFO(message);
    if (exit.has_value()) {  // refused by the flags already (a bad name of a kind)
      CHECK(*exit == 2);
      return;
    }
    REQUIRE_THROWS_QUINTET(job.validate(world), InvalidArgument, message);
  };
  const JobConfig gpt;
  refused(gpt, 2, {"--tp", "2", "--dp", "2"}, "--tp 2 x --dp 2 = 4 ranks, but the job has 2");
  refused(gpt, 2, {"--tp", "2", "--heads", "5", "--hidden", "80"},
          "heads = 5 is not divisible by the tensor-parallel size tp = 2");
  refused(gpt, 2, {"--tp", "2", "--sp", "--seq-len", "33"},
          "--seq-len 33 is not divisible by --tp 2");
  refused(gpt, 1, {"--sp"}, "--sp needs --tp > 1");
  refused(gpt, 1, {"--micro-batch", "5"},
          "--global-batch 12 must be a positive multiple of --micro-batch 5");
  refused(gpt, 1, {"--zero", "3"}, "--zero 3: expected 0, 1 or 2");
  refused(gpt, 2, {"--tp", "2", "--sp", "--tp-overlap", "--tp-overlap-chunks", "3"},
          "--tp-overlap-chunks 3 does not divide each rank's sequence of 16 tokens");
  refused(gpt, 1, {"--tp-overlap-chunks", "0"}, "--tp-overlap-chunks 0: expected a count >= 1");
  refused(gpt, 1, {"--fp8", "hybrid", "--fp8-amax-history", "0"},
          "--fp8-amax-history 0: expected a count >= 1");
  refused(gpt, 2, {"--fp8", "hybrid", "--cp", "2"}, "--fp8 hybrid with --cp 2");
  refused(gpt, 1, {"--fp8", "on"}, "expected off or hybrid");
  refused(gpt, 1, {"--fp8-lm-head"}, "--fp8-lm-head needs --fp8 hybrid");
  refused(gpt, 1, {"--bucket-mb", "0"}, "--bucket-mb 0: expected a size in MiB");
  refused(gpt, 2, {"--pp", "4", "--layers", "4"},
          "--tp 1 x --dp 1 x --pp 4 = 4 ranks, but the job has 2");
  refused(gpt, 2, {"--pp", "2", "--vpp", "2", "--schedule", "interleaved"},
          "--layers 2 cannot fill --pp 2 x --vpp 2 = 4 pipeline chunks");
  refused(gpt, 2, {"--pp", "2", "--schedule", "zb-h1", "--global-batch", "2"},
          "zb-h1 needs microbatches >= pp");
  refused(gpt, 2,
          {"--pp", "2", "--vpp", "2", "--layers", "4", "--schedule", "interleaved",
           "--global-batch", "6"},
          "must be a multiple of pp, found 3");
  refused(gpt, 2, {"--cp", "2", "--seq-len", "30"},
          "--seq-len 30 is not divisible by 2 x --cp 2 = 4");
  refused(gpt, 4, {"--cp", "4", "--cp-kind", "ulysses", "--heads", "6", "--hidden", "96"},
          "heads = 6 is not divisible by tp 1 x cp 4");
  refused(gpt, 2, {"--cp", "2", "--dp", "2"},
          "--tp 1 x --cp 2 x --dp 2 x --pp 1 = 4 ranks, but the job has 2");
  refused(gpt, 1, {"--lr-schedule", "wsd", "--decay-fraction", "0"},
          "--decay-fraction 0: expected a share in (0, 1]");
  refused(gpt, 1, {"--vpp", "2"}, "vpp = 2 model chunks per rank needs a pipeline");
  refused(gpt, 1, {"--resume", "a", "--resume-if-exists", "b"}, "give one of them");
  refused(gpt, 1, {"--stop-at", "200"}, "--stop-at 200: expected 0 .. --steps 100");
  refused(gpt, 1, {"--save-every", "5"}, "--save-every 5 needs --save DIR");
  refused(gpt, 1, {"--keep-last", "2"}, "--keep-last 2 needs --save DIR");
  refused(gpt, 1, {"--save", "d", "--keep-last", "-1"}, "--keep-last -1: expected >= 0");
  refused(gpt, 1, {"--trace-steps", "1:2"}, "--trace-steps 1:2 needs --trace DIR");
  refused(gpt, 1, {"--trace", "t", "--trace-steps", "3:1"}, "--trace-steps 3:1: expected A:B");
  refused(gpt, 1, {"--vocab", "100"}, "--vocab 100: the built-in dataset has 256 tokens");
  // Validation.
  refused(gpt, 1, {"--val-every", "5"}, "--val-every 5 needs --val-data GLOB");
  refused(gpt, 1, {"--val-batches", "3"}, "--val-batches 3 needs --val-data GLOB");
  refused(gpt, 1, {"--eval-only", "--resume", "r"}, "--eval-only needs --val-data GLOB");
  refused(gpt, 1, {"--val-data", "v", "--val-batches", "-1"},
          "--val-every 0 --val-batches -1: expected >= 0");
  refused(gpt, 1, {"--val-data", "v", "--eval-only"},
          "--eval-only evaluates a trained model: give it with --resume DIR or --init-from-hf DIR");
  refused(gpt, 1, {"--val-data", "v", "--eval-only", "--resume-if-exists", "r"},
          "--eval-only evaluates a trained model");
  refused(gpt, 1, {"--val-data", "v", "--eval-only", "--resume", "r", "--save", "s"},
          "--eval-only writes nothing: drop --save s");
  refused(
      gpt, 1,
      {"--arch", "llama", "--val-data", "v", "--eval-only", "--resume", "r", "--export-hf", "h"},
      "--eval-only writes nothing: drop --export-hf h");
  refused(gpt, 1, {"--val-data", "v", "--eval-only", "--resume", "r", "--trace", "t"},
          "--eval-only runs no step to trace: drop --trace t");
  refused(gpt, 1, {"--val-data", "v", "--val-every", "5", "--eval-only", "--resume", "r"},
          "--val-every 5 needs training (it evaluates between steps), and --eval-only evaluates "
          "once and runs no step; drop --val-every");
  parsed(gpt, {"--val-data", "v", "--val-batches", "2", "--eval-only", "--resume", "r"})
      .validate(1);
  parsed(gpt, {"--val-data", "v", "--val-every", "5"}).validate(1);
  refused(gpt, 1, {"--data", "d", "--val-data", "builtin", "--vocab", "100"},
          "--vocab 100: the built-in dataset has 256 tokens; use --vocab >= 256 (or other "
          "--val-data)");
  refused(gpt, 1, {"--lr", "0.001", "--min-lr", "0.01"}, "need lr > 0 and 0 <= min-lr <= lr");
  refused(gpt, 1, {"--loader-threads", "0"}, "--loader-threads 0: expected >= 1");
  refused(gpt, 1, {"--loader-delay-ms", "-5"}, "--loader-delay-ms -5: expected a time >= 0");
  // A setting that only matters with another that is off, given: refused, naming both.
  refused(gpt, 1, {"--rope-theta", "500000"},
          "--rope-theta 500000 needs --positions rope (RoPE's base; this model's positions are "
          "learned)");
  refused(gpt, 1, {"--arch", "llama", "--positions", "learned", "--rope-theta", "1000000"},
          "--rope-theta 1000000 needs --positions rope");
  refused(gpt, 1, {"--decay-fraction", "0.5"},
          "--decay-fraction 0.5 needs --lr-schedule wsd (the share of the steps that decay; "
          "--lr-schedule cosine has none)");
  refused(gpt, 1, {"--lr-schedule", "constant", "--min-lr", "0.0001"},
          "--min-lr 0.0001 needs a decaying --lr-schedule (cosine, linear or wsd)");
  refused(gpt, 1, {"--tp-overlap-chunks", "4"}, "--tp-overlap-chunks 4 needs --tp-overlap");
  refused(gpt, 1, {"--tp-overlap"}, "--tp-overlap needs --tp > 1");
  refused(gpt, 1, {"--check-batches"}, "--check-batches needs --tp > 1");
  refused(gpt, 1, {"--fp8", "hybrid", "--fp8-amax-history", "8"},
          "--fp8-amax-history 8 needs --fp8-scaling delayed");
  refused(gpt, 1, {"--cp-kind", "ulysses"}, "--cp-kind needs --cp > 1");
  refused(gpt, 1, {"--bench-skip", "2"}, "--bench-skip 2 needs --bench");
  refused(gpt, 1, {"--exit-during-save", "3"}, "--exit-during-save 3 needs --save DIR");
  refused(gpt, 1, {"--data", "d", "--synthetic-order", "1"},
          "--synthetic-order 1 needs the built-in dataset (the Markov order of its tokens), and "
          "--data d trains on other data");
  refused(gpt, 1, {"--data-dir", "here", "--data", "d", "--val-data", "v"},
          "--data-dir here needs the built-in dataset (where it is made), and --data d trains on "
          "other data");
  // The data-parallel settings where every gradient is reduced over one rank: refused, naming
  // what would give them ranks; with dp or cp > 1, sp at tp > 1, or experts over edp > 1, let be.
  refused(gpt, 1, {"--zero", "1"},
          "--zero 1 needs --dp > 1: it shards the optimizer state over the ranks that reduce a "
          "gradient, and at --dp 1 --cp 1 each gradient is reduced over one rank alone");
  refused(gpt, 2, {"--tp", "2", "--bucket-mb", "5"},
          "--bucket-mb 5 needs --dp > 1: it sizes the buckets of the gradient reductions, and at "
          "--dp 1 --cp 1 with --tp 2 without --sp each gradient");
  refused(gpt, 2, {"--pp", "2", "--no-overlap"}, "--no-overlap needs --dp > 1");
  parsed(gpt, {"--zero", "0"}).validate(1);
  parsed(gpt, {"--dp", "2", "--zero", "1", "--bucket-mb", "5", "--no-overlap"}).validate(2);
  parsed(gpt, {"--cp", "2", "--zero", "1", "--no-overlap"}).validate(2);
  parsed(gpt, {"--tp", "2", "--sp", "--zero", "2", "--bucket-mb", "1"}).validate(2);
  // Without --data, or with --val-data builtin, the built-in dataset is read: its settings count.
  parsed(gpt, {"--synthetic-order", "1", "--data-dir", "here"}).validate(1);
  parsed(gpt,
         {"--data", "d", "--val-data", "builtin", "--synthetic-order", "1", "--data-dir", "here"})
      .validate(1);
  // The same settings from a family or a default are let be, and given with what they need, run.
  parsed(gpt, {"--arch", "llama", "--positions", "learned"}).validate(1);
  parsed(gpt, {"--arch",
               "llama",
               "--rope-theta",
               "1000000",
               "--lr-schedule",
               "wsd",
               "--decay-fraction",
               "0.5",
               "--fp8",
               "hybrid",
               "--fp8-scaling",
               "delayed",
               "--fp8-amax-history",
               "8",
               "--bench",
               "--bench-skip",
               "2",
               "--save",
               "ckpt",
               "--exit-during-save",
               "3"})
      .validate(1);
  // The job file's keys count as given, as the flags do.
  const std::string theta = write_file("quintet_job_config_theta.json", R"({"rope-theta": 5e5})");
  refused(gpt, 1, {"--config", theta}, "--rope-theta 500000 needs --positions rope");
  CHECK(parsed(gpt, {"--config", theta, "--steps", "3"}).given ==
        std::vector<std::string>{"rope-theta", "steps"});
  parsed(gpt, {"--config", theta, "--positions", "rope"}).validate(1);
  std::filesystem::remove(theta);
  const std::string decay =
      write_file("quintet_job_config_decay.json", R"({"decay-fraction": 0.5, "bench-skip": 2})");
  refused(gpt, 1, {"--config", decay}, "--decay-fraction 0.5 needs --lr-schedule wsd");
  refused(gpt, 1, {"--config", decay, "--lr-schedule", "wsd"}, "--bench-skip 2 needs --bench");
  std::filesystem::remove(decay);
  // Hugging Face export: refused before training, not after it.
  refused(gpt, 1, {"--export-hf", "hf_out"},
          "no Hugging Face layout here: its norms are LayerNorm");
  refused(gpt, 1, {"--arch", "llama", "--export-hf", "hf_out", "--export-dtype", "fp8"},
          "--export-dtype fp8: expected f32");
  refused(gpt, 1, {"--arch", "llama", "--export-hf-every", "5"},
          "--export-hf-every 5 needs --export-hf DIR");
  refused(gpt, 1, {"--arch", "llama", "--export-hf", "hf_out", "--export-hf-every", "-1"},
          "--export-hf-every -1: expected >= 0");
  refused(gpt, 1, {"--arch", "llama", "--export-hf", "/"}, "/ exists already (as a directory)");
  refused(gpt, 1, {"--arch", "llama", "--export-hf", "/dev/null/a/hf"},
          "/dev/null/a/hf: /dev/null is not a directory");
  // Model families and the flags of their structure.
  refused(gpt, 1, {"--arch", "mixtral"},
          "--arch mixtral: a mixture-of-experts family, and this trainer's model is dense");
  refused(gpt, 1, {"--arch", "qwen3-moe"}, "train it with the MoE trainer");
  refused(gpt, 1, {"--arch", "gpt3"}, "use gpt2, llama, qwen3, mixtral or qwen3-moe");
  refused(gpt, 1, {"--norm", "batchnorm"}, "use layernorm or rmsnorm");
  refused(gpt, 1, {"--activation", "relu"}, "use gelu or swiglu");
  refused(gpt, 1, {"--positions", "none"}, "use learned or rope");
  refused(gpt, 1, {"--arch", "llama", "--kv-heads", "3"}, "kv_heads = 3 does not divide heads = 4");
  refused(gpt, 3,
          {"--arch", "llama", "--heads", "6", "--hidden", "96", "--kv-heads", "2", "--tp", "3"},
          "kv_heads = 2 and tp = 3: each tp rank holds the key/value heads");
  refused(gpt, 1, {"--arch", "llama", "--hidden", "60"},
          "which must be even (head dim = 15), with rope_theta > 0");
  refused(gpt, 1, {"--positions", "rope", "--head-dim", "9"}, "which must be even (head dim = 9)");
  refused(gpt, 1, {"--arch", "llama", "--rope-theta", "0"}, "with rope_theta > 0 (got 0)");
  refused(gpt, 3,
          {"--arch", "llama", "--heads", "6", "--hidden", "96", "--kv-heads", "2", "--cp", "3",
           "--cp-kind", "ulysses", "--seq-len", "24"},
          "splits the 2 local key/value heads (heads 6, kv_heads 2, tp 1) over cp 3");
  refused(gpt, 1, {"--kv-heads", "-1"}, "kv_heads = -1 and head_dim = 0 must be > 0");
  refused(gpt, 1, {"--ffn-hidden", "-2"}, "ffn_hidden = -2 must be > 0");
  // Key/value heads replicated over tp (kv_heads < tp), and grouped-query attention under cp.
  parsed(gpt, {"--arch", "llama", "--kv-heads", "1", "--tp", "2"}).validate(2);
  parsed(gpt, {"--arch", "llama", "--kv-heads", "2", "--cp", "2"}).validate(2);
  parsed(gpt, {"--arch", "llama", "--kv-heads", "1", "--cp", "2", "--cp-kind", "ulysses"})
      .validate(2);
  // The library accepts uneven cuts of the layers over the pipeline chunks, so the job does too.
  parsed(gpt, {"--layers", "3", "--pp", "2"}).validate(2);

  JobConfig moe = JobConfig::moe_preset();  // with the experts of moe_train_test.sh
  moe.model.moe.router.experts = 4;
  refused(moe, 2, {"--dp", "2", "--ep", "2", "--experts", "3"},
          "3 experts are not divisible by the expert-parallel size ep = 2");
  refused(moe, 3, {"--dp", "3", "--ep", "3", "--experts", "4", "--global-batch", "6"},
          "4 experts are not divisible by the expert-parallel size ep = 3");
  refused(moe, 1, {"--top-k", "5"}, "top_k = 5 is more than the 4 experts");
  refused(moe, 1, {"--top-k", "9", "--experts", "16"}, "top_k = 9 must be between 1 and 8");
  refused(moe, 2, {"--dp", "2", "--ep", "2", "--etp", "2"},
          "--etp 2 x --ep 2 x --pp 1 = 4 does not divide the 2 ranks");
  refused(moe, 1, {"--moe-chunks", "0"}, "--moe-chunks 0: expected 1 .. 64");
  refused(moe, 1, {"--arch", "llama"},
          "--arch llama: a dense family, and this trainer's model is a mixture of experts");
  parsed(moe, {"--dp", "2", "--ep", "2"}).validate(2);
  // The experts' gradients reduced over edp 2 at dp 1 give the data-parallel settings a meaning.
  parsed(moe, {"--tp", "2", "--etp", "1", "--zero", "1", "--no-overlap"}).validate(2);
  refused(moe, 2, {"--tp", "2", "--etp", "1", "--ep", "2", "--zero", "2"},
          "--zero 2 needs --dp > 1: it shards the optimizer state over the ranks that reduce a "
          "gradient, and at --dp 1 --cp 1 with --tp 2 without --sp (and each expert's over edp 1)");
  // Dense blocks among the MoE ones: inside the model, among those --moe-every makes MoE, and
  // one MoE block left; --init-from-hf's checks are in the test above.
  refused(moe, 1, {"--dense-layers", "2"},
          "moe.dense_layers holds block 2, and the model's blocks are 0 .. 1");
  refused(moe, 1, {"--dense-layers", "0-1"}, "mlp = moe, and no block is MoE");
  refused(moe, 1, {"--moe-every", "2", "--dense-layers", "1"}, "which is dense already");
  refused(moe, 1, {"--dense-layers", "1,0"}, "0 does not come after 1");
  const JobConfig mixed = parsed(moe, {"--dense-layers", "0", "--dp", "2", "--ep", "2"});
  mixed.validate(2);
  CHECK((!mixed.model.is_moe_block(0) && mixed.model.is_moe_block(1)));

  // A dense job (whose flags have no --ep nor MoE settings) built by hand with either is refused.
  JobConfig dense_ep;
  dense_ep.parallel.dp = dense_ep.parallel.ep = 2;
  REQUIRE_THROWS_QUINTET(dense_ep.validate(2), InvalidArgument,
                         "an expert-parallel layout (ep = 2) with mlp = dense");
  JobConfig dense_moe = moe;
  dense_moe.model.mlp = model::MlpKind::dense;
  REQUIRE_THROWS_QUINTET(dense_moe.validate(1), InvalidArgument,
                         "but mlp = dense builds no MoE layer");
}

TEST_CASE("job config: what the library builds from a job", "[train]") {
  const JobConfig job =
      parsed(JobConfig{},
             {"--tp-overlap", "--tp-overlap-chunks", "4", "--bucket-mb", "0.5", "--no-overlap",
              "--zero", "2", "--global-batch", "32", "--micro-batch", "2", "--dp", "2"});
  CHECK(job.gpt_config().tp_overlap_chunks == 4);
  CHECK(parsed(JobConfig{}, {"--tp-overlap-chunks", "4"}).gpt_config().tp_overlap_chunks == 1);
  CHECK(job.accumulation() == 8);
  CHECK(job.data_parallel().bucket_bytes == 512 * 1024);
  CHECK(job.data_parallel().first_bucket_bytes == 512 * 1024);  // never above the others
  CHECK_FALSE(job.data_parallel().overlap);
  CHECK(job.data_parallel().zero_stage == 2);
  CHECK(job.optimizer().hyper.weight_decay == 0.1f);
  CHECK(job.optimizer().hyper.beta2 == 0.95f);
  CHECK(job.learning_rate_schedule().total_steps == 100);
  const JobConfig traced = parsed(JobConfig{}, {"--trace", "t", "--trace-steps", "3:9"});
  CHECK(traced.traced_steps(0, 5) == std::pair<std::int64_t, std::int64_t>{3, 5});
  CHECK(job.traced_steps(0, 5).first > job.traced_steps(0, 5).second);  // no trace
}

TEST_CASE("validation: after every --val-every steps and the last, with --val-data", "[train]") {
  JobConfig job;
  job.training.steps = 10;
  CHECK_FALSE(job.evaluates_after(10));  // no validation data
  job.validation.data = "val.bin";
  const auto after = [&job] {
    std::vector<std::int64_t> out;
    for (std::int64_t s = 1; s <= job.last_step(); ++s) {
      if (job.evaluates_after(s)) out.push_back(s);
    }
    return out;
  };
  CHECK(after() == std::vector<std::int64_t>{10});
  job.validation.every = 4;
  CHECK(after() == std::vector<std::int64_t>{4, 8, 10});
  job.training.stop_at = 6;  // a run cut at step 6 evaluates there
  CHECK(after() == std::vector<std::int64_t>{4, 6});
}

TEST_CASE("validation: whole global batches of the data, or as many as asked", "[train]") {
  CHECK(train::validation_batches(70, 12, 0) == 5);  // the 10 windows after batch 5 left out
  CHECK(train::validation_batches(72, 12, 0) == 6);
  CHECK(train::validation_batches(70, 12, 2) == 2);
  CHECK(train::validation_batches(70, 12, 5) == 5);
  REQUIRE_THROWS_QUINTET(train::validation_batches(70, 12, 6), InvalidArgument,
                         "--val-batches 6: global batches of 12 windows, and the validation data "
                         "holds 70 windows, 5 whole batches; ask for at most 5");
  REQUIRE_THROWS_QUINTET(train::validation_batches(11, 12, 0), InvalidArgument,
                         "holds 11 windows, fewer than one global batch of 12");
}
