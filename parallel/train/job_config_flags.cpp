// The flags of a JobConfig (see job_config.hpp): parse_job_args, job_help, settings().
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <memory>

#include "parallel/train/internal/job_flags.hpp"
#include "quintet/collectives/bootstrap.hpp"  // detect_launch: this rank, before init
#include "quintet/core/error.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"  // --init-from-hf

namespace quintet::train {

namespace detail {

namespace {

// The name among `names` that parse maps to value (the library's parse function is the one table
// of names).
template <class Enum, class Parse>
std::string name_of(Enum value, std::initializer_list<const char*> names, Parse parse) {
  for (const char* n : names) {
    if (parse(n) == value) return n;
  }
  return {};
}

// A flag whose text the library's parse function turns into *value (naming the choices when it
// is none of them).
template <class Enum, class Parse>
CLI::Option* add_kind(CLI::App& app, const std::string& flag, Enum* value, Parse parse,
                      const std::string& current, const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag, [value, parse](const std::string& text) { *value = parse(text); }, help)
      ->default_str(current);
}

// A switch, its default text the value now.
CLI::Option* add_switch(CLI::App& app, const std::string& flag, bool* value,
                        const std::string& help) {
  return app.add_flag(flag, *value, help)->default_str(*value ? "true" : "false");
}

}  // namespace

void add_job_flags(CLI::App& app, JobConfig& job) {
  // A flag given twice takes its last value, so wrappers (scripts/demo.sh) can be overridden.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "a JSON job file, {\"flag-name\": value, ...}; the flags given here override it");
  model::GptConfig& m = job.model;
  ParallelConfig& p = job.parallel;
  JobConfig::Training& t = job.training;
  app.add_option("--layers", m.layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", m.hidden, "model width")->capture_default_str();
  app.add_option("--heads", m.heads, "attention heads")->capture_default_str();
  app.add_option("--vocab", m.vocab, "vocabulary size (>= the dataset's)")->capture_default_str();
  app.add_option("--seq-len", m.seq_len, "tokens per sequence")->capture_default_str();
  // --arch after the sizes (an MoE family's expert width follows --hidden) and before the flags
  // that override the structure it sets (callbacks run in this order, whatever the command
  // line's), the MoE flags included.
  app.add_option_function<std::string>(
         "--arch", [&m](const std::string& text) { m.set_family(model::parse_model_family(text)); },
         "model family: gpt2 (LayerNorm, GELU, learned positions, biases), llama (RMSNorm, "
         "SwiGLU, RoPE, no biases), qwen3 (llama's with QK-norm); with the MoE trainer mixtral "
         "(llama's, 8 experts top-2) and qwen3-moe (qwen3's, 128 experts of 3/8 --hidden, "
         "top-8); the flags below override it")
      ->default_str(std::string(model::model_family_name(m.family)));
  app.add_option("--kv-heads", m.kv_heads,
                 "key/value heads (grouped-query attention, 1: MQA): a divisor of --heads, and a "
                 "multiple or a divisor of --tp (below tp each is replicated) (0: --heads)")
      ->capture_default_str();
  app.add_option("--head-dim", m.head_dim, "each head's width (0: hidden / heads)")
      ->capture_default_str();
  app.add_option("--ffn-hidden", m.ffn_hidden, "MLP width (0: 4 x hidden)")->capture_default_str();
  add_kind(app, "--norm", &m.norm, model::parse_norm_kind,
           name_of(m.norm, {"layernorm", "rmsnorm"}, model::parse_norm_kind),
           "normalization: layernorm or rmsnorm");
  add_kind(app, "--activation", &m.activation, model::parse_activation,
           name_of(m.activation, {"gelu", "swiglu"}, model::parse_activation),
           "MLP: gelu (with biases) or swiglu (gated, without)");
  app.add_option_function<std::string>(
         "--positions",
         [&m](const std::string& text) {
           QUINTET_CHECK(text == "learned" || text == "rope",
                         "unknown positions \"{}\"; use learned or rope", text);
           m.learned_positions = text == "learned";
           m.rope = !m.learned_positions;
         },
         "position information: learned (an absolute position table) or rope (rotary, on q and "
         "k)")
      ->default_str(m.rope ? "rope" : "learned");
  app.add_option("--rope-theta", m.rope_theta, "RoPE's base (with --positions rope)")
      ->capture_default_str();
  add_switch(app, "--qk-norm", &m.qk_norm,
             "an RMSNorm over each head's queries and keys, before RoPE (Qwen3)");
  app.add_flag("!--no-bias", m.bias, "no biases in the attention projections")
      ->default_str(m.bias ? "false" : "true");
  add_kind(app, "--recompute", &m.recompute, model::parse_recompute_kind,
           name_of(m.recompute, {"none", "attention", "full"}, model::parse_recompute_kind),
           "activation recompute: none, attention (each block's attention) or full (each whole "
           "block): less memory for one more forward");
  add_kind(app, "--fp8", &m.fp8.mode, nn::parse_fp8_mode, nn::fp8_mode_name(m.fp8.mode),
           "FP8 training: off, or hybrid (the blocks' linear layers with x and w in E4M3, the "
           "output gradient in E5M2; cuBLASLt's FP8 GEMMs on a GPU, emulated on the CPU)");
  add_kind(app, "--fp8-scaling", &m.fp8.scaling, nn::parse_fp8_scaling,
           nn::fp8_scaling_name(m.fp8.scaling),
           "with --fp8: current (each tensor's own amax) or delayed (the amax history's max)");
  app.add_option("--fp8-amax-history", m.fp8.amax_history,
                 "with --fp8-scaling delayed: steps of amax history")
      ->capture_default_str();
  add_switch(app, "--fp8-lm-head", &m.fp8_lm_head,
             "with --fp8 hybrid: the LM head in FP8 too (off: in the model's dtype)");
  add_switch(app, "--tied-embeddings", &m.tied_embeddings,
             "the LM head reuses the token embedding's table (across pipeline stages too)");
  app.add_option("--micro-batch", t.micro_batch, "sequences per rank per forward")
      ->capture_default_str();
  app.add_option("--global-batch", t.global_batch,
                 "sequences per optimizer step over all dp ranks (accumulation follows)")
      ->capture_default_str();
  app.add_option("--tp", p.tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--dp", p.dp, "data-parallel size (tp * cp * dp * pp = ranks)")
      ->capture_default_str();
  app.add_option("--cp", p.cp, "context-parallel size: ranks that split each sequence")
      ->capture_default_str();
  add_kind(app, "--cp-kind", &m.context_parallel, context::parse_context_parallel_kind,
           name_of(m.context_parallel, {"ring", "ulysses"}, context::parse_context_parallel_kind),
           "how attention spans the cp ranks: ring (K/V around a ring) or ulysses (all-to-all to "
           "a head split)");
  app.add_option("--pp", p.pp, "pipeline-parallel size (stages)")->capture_default_str();
  app.add_option("--vpp", p.vpp, "model chunks per pipeline rank (interleaved, zb-v)")
      ->capture_default_str();
  add_kind(app, "--schedule", &t.schedule, pipeline::parse_schedule_kind,
           std::string(pipeline::schedule_kind_name(t.schedule)),
           "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v");
  add_switch(app, "--sp", &m.sequence_parallel, "sequence parallelism (with --tp > 1)");
  add_switch(app, "--tp-overlap", &job.tp_overlap,
             "cut the tp communication into chunks along the sequence, each overlapping a GEMM");
  app.add_option("--tp-overlap-chunks", job.tp_overlap_chunks,
                 "with --tp-overlap: chunks of each rank's sequence (seq-len / cp, / tp with --sp)")
      ->capture_default_str();
  app.add_option("--zero", t.zero,
                 "ZeRO stage: 0, 1 or 2 (sharded over the ranks that reduce a gradient: dp x cp, "
                 "also tp with --sp, edp for experts)")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  app.add_option("--warmup", t.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "learning rate at the last step (decaying schedules)")
      ->capture_default_str();
  add_kind(app, "--lr-schedule", &t.lr_schedule, nn::parse_lr_schedule_kind,
           std::string(nn::lr_schedule_kind_name(t.lr_schedule)),
           "after warmup: cosine, linear, wsd (warmup-stable-decay) or constant");
  app.add_option("--decay-fraction", t.decay_fraction,
                 "wsd: the share of the steps after warmup that decay to --min-lr")
      ->capture_default_str();
  app.add_option("--weight-decay", t.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--clip", t.clip, "clip the global gradient norm to this (<= 0: off)")
      ->capture_default_str();
  app.add_option("--steps", t.steps, "optimizer steps")->capture_default_str();
  app.add_option("--stop-at", t.stop_at,
                 "stop (and save, with --save) after this step; the schedule still spans --steps "
                 "(for jobs cut into pieces by a time limit)")
      ->capture_default_str();
  // Read by the runtime (RuntimeConfig::from_args, before these flags); listed here for --help,
  // and not taken from a job file.
  const auto runtime_flag = [&app](const std::string& flag, const std::string& help) {
    return app
        .add_option_function<std::string>(
            flag, [](const std::string&) {}, help)
        ->configurable(false);
  };
  runtime_flag("--seed", "seed of the init and the data order")
      ->default_str(std::to_string(t.seed));
  runtime_flag("--device", "cpu or cuda (default: cuda when a GPU is visible)");
  runtime_flag("--timeout-s", "bound on communicator setup and waits");
  runtime_flag("--log-level", "debug, info, warn, error, off");
  runtime_flag("--mpi-idle-start-us",
               "how long a CPU communicator's thread leaves a new operation for its caller to run "
               "(default 50; 0: start at once)");
  runtime_flag("--cpu-affinity",
               "auto (the default: each rank's threads on the CPUs next to its GPU, or on its "
               "share of the host's) or none (the OS places them)");
  app.add_flag_function(
         "--check-collectives", [](std::int64_t) {},
         "debug mode: the ranks compare every collective's fingerprint before it is sent (or "
         "QUINTET_CHECK_COLLECTIVES=1)")
      ->configurable(false);
  runtime_flag("--flight-dir",
               "where each rank writes flight_rank<r>.json on a timeout, an error or SIGUSR1 "
               "(default: the working directory; scripts/analyze_flight.py reads them)");
  runtime_flag("--flight-size",
               "operations each communicator's flight recorder keeps (default 2048)");
  app.add_option("--data", job.data.shards, "token shards (glob); default: the built-in dataset")
      ->capture_default_str();
  app.add_option("--data-dir", job.data.dir,
                 "where the built-in dataset is made (default: $QUINTET_DATA_DIR, else "
                 "~/.cache/quintet/data: one copy per machine); not with --data, unless "
                 "--val-data builtin")
      ->capture_default_str();
  app.add_option("--synthetic-order", job.data.synthetic_order,
                 "built-in dataset: Markov order (1 is learnt in minutes on a CPU); not with "
                 "--data, unless --val-data builtin")
      ->capture_default_str();
  app.add_option("--loader-threads", job.data.loader_threads, "data loader threads per rank")
      ->capture_default_str();
  app.add_option("--loader-delay-ms", job.data.loader_delay_ms,
                 "tests and diagnosis: each batch's read takes this many ms longer (a slow disk)")
      ->capture_default_str();
  JobConfig::Validation& v = job.validation;
  app.add_option("--val-data", v.data,
                 "validation token shards (glob), or builtin: the built-in dataset's; its loss "
                 "(val_loss) is reported after the last step")
      ->capture_default_str();
  app.add_option("--val-every", v.every,
                 "with --val-data: also evaluate every N steps (not with --eval-only)")
      ->capture_default_str();
  app.add_option("--val-batches", v.batches,
                 "global batches per evaluation, from the first window (0: every window there "
                 "is, once)")
      ->capture_default_str();
  add_switch(app, "--eval-only", &v.eval_only,
             "evaluate the model of --resume or --init-from-hf on --val-data, and exit");
  JobConfig::Checkpoint& ck = job.checkpoint;
  app.add_option("--save", ck.save, "checkpoint directory")->capture_default_str();
  add_switch(app, "--async-save", &ck.async_save,
             "write checkpoints in the background while training goes on");
  app.add_option("--save-every", ck.save_every, "save every N steps (and at the end)")
      ->capture_default_str();
  app.add_option("--keep-last", ck.keep_last,
                 "keep only the newest N checkpoints in --save, removing older ones after each "
                 "save (0: keep every one)")
      ->capture_default_str();
  app.add_option("--resume", ck.resume,
                 "resume from the latest checkpoint in this directory (an error when it holds "
                 "none)")
      ->capture_default_str();
  app.add_option("--resume-if-exists", ck.resume_if_exists,
                 "resume from the latest checkpoint in this directory when there is one, else "
                 "start fresh")
      ->capture_default_str();
  app.add_option(
         "--init-from-hf", ck.init_from_hf,
         "start from a Hugging Face model directory (config.json and safetensors: Llama, "
         "Qwen2, Qwen3, Mixtral, Qwen3-MoE): the model is config.json's, flags that contradict "
         "it are refused; not with --resume")
      ->capture_default_str();
  app.add_option("--export-hf", ck.export_hf,
                 "at the end of the run, write the model as a Hugging Face directory (config."
                 "json, safetensors) that transformers and vLLM load; Llama, Qwen3, Mixtral and "
                 "Qwen3-MoE models (--arch; Qwen2 from --init-from-hf); it must not exist")
      ->capture_default_str();
  app.add_option("--export-hf-every", ck.export_hf_every,
                 "also export every N steps: each export into --export-hf's DIR/step_NNNNNN")
      ->capture_default_str();
  app.add_option("--export-dtype", ck.export_dtype,
                 "the exported weights: f32 (the master weights, lossless) or bf16 (rounded to "
                 "nearest even)")
      ->capture_default_str();
  app.add_option("--exit-during-save", ck.exit_during_save,
                 "testing: exit midway through the save of this step")
      ->capture_default_str()
      ->group("");
  app.add_option("--inject-fault", job.observe.inject_fault,
                 "testing: KIND:STEP:RANK, rank RANK throws (KIND throw) or stops itself (stop) "
                 "at the start of step STEP")
      ->capture_default_str()
      ->group("");
  app.add_option("--bucket-mb", t.bucket_mb,
                 "MiB of gradient per data-parallel bucket (the first is at most 1 MiB); as "
                 "--zero, only where gradients are reduced")
      ->capture_default_str();
  app.add_flag("!--no-overlap", t.overlap,
               "run data-parallel communication after backward, not during it; as --zero, "
               "only where gradients are reduced")
      ->default_str(t.overlap ? "false" : "true");
  add_switch(app, "--check-batches", &t.check_batches,
             "debug: verify every step that the tensor-parallel ranks read the same tokens");
  add_switch(app, "--bench", &job.observe.bench,
             "report medians over the steps after --bench-skip");
  app.add_option("--bench-skip", job.observe.bench_skip, "warm-up steps left out of --bench")
      ->capture_default_str();
  if (m.mlp == model::MlpKind::moe) {
    expert::RouterConfig& r = m.moe.router;
    app.add_option("--experts", r.experts, "experts per MoE block")->capture_default_str();
    app.add_option_function<int>(
           "--top-k",
           [&r](int k) {
             r.top_k = k;
             r.renormalize = k > 1;  // top-1 keeps the raw probability, so the router learns
           },
           "experts per token (1..8)")
        ->default_str(std::to_string(r.top_k));
    app.add_option("--ep", p.ep, "expert-parallel size: ranks that hold different experts")
        ->capture_default_str();
    app.add_option("--etp", p.etp,
                   "expert-tensor-parallel size: ranks that split each expert (0: --tp)")
        ->capture_default_str();
    app.add_option("--capacity-factor", r.capacity_factor,
                   "tokens an expert takes, over the even share (0: dropless)")
        ->capture_default_str();
    add_kind(app, "--router", &r.score, expert::parse_router_score,
             name_of(r.score, {"softmax", "sigmoid"}, expert::parse_router_score),
             "router scores: softmax or sigmoid");
    app.add_option("--aux-loss-coeff", r.aux_loss_coeff, "load-balancing loss coefficient")
        ->capture_default_str();
    app.add_option("--z-loss-coeff", r.z_loss_coeff, "router z-loss coefficient")
        ->capture_default_str();
    app.add_option("--aux-free-bias-rate", r.bias_rate,
                   "auxiliary-loss-free balancing: the per-step bias update (0: off)")
        ->capture_default_str();
    app.add_option("--shared-experts", m.moe.shared_experts,
                   "width of a shared MLP every token takes, in experts")
        ->capture_default_str();
    app.add_option("--expert-ffn", m.moe.expert_ffn, "each expert's width (0: --ffn-hidden)")
        ->capture_default_str();
    app.add_option("--moe-every", m.moe.every, "every N-th block is MoE (from block 0)")
        ->capture_default_str();
    app.add_option_function<std::string>(
           "--dense-layers",
           [&m](const std::string& text) { m.moe.dense_layers = model::parse_layer_list(text); },
           "blocks that keep the dense MLP (--ffn-hidden wide) among those --moe-every makes "
           "MoE: ascending indices and ranges, as 0-2,5 (DeepSeek's first 3 dense)")
        ->default_str(model::layer_list_text(m.moe.dense_layers));
    app.add_option("--moe-chunks", m.moe.overlap_chunks,
                   "token chunks per MoE exchange: chunk c+1 travels while chunk c's experts "
                   "compute (1: no overlap)")
        ->capture_default_str();
  }
  add_switch(app, "--json", &job.observe.json, "one JSON object per step");
  app.add_option("--trace", job.observe.trace,
                 "write a Chrome/Perfetto trace of each rank to DIR/trace_rank<r>.json "
                 "(scripts/merge_traces.py merges them)")
      ->capture_default_str();
  app.add_option("--trace-steps", job.observe.trace_steps,
                 "the steps --trace records, A:B (1-based, inclusive; default 2:4)")
      ->capture_default_str();
  app.add_flag("!--no-progress", job.observe.progress, "no progress bar");
  // The job file takes every flag but the help, itself and the runtime's.
  std::vector<std::string> settings, runtime;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty() || opt->get_lnames().front() == "help" ||
        opt == app.get_config_ptr())
      continue;
    (opt->get_configurable() ? settings : runtime).push_back(opt->get_lnames().front());
  }
  std::vector<std::string> moe_only;
  if (m.mlp != model::MlpKind::moe) moe_only = moe_only_settings(app);
  app.config_formatter(
      std::make_shared<JsonJobFile>(std::move(settings), std::move(runtime), std::move(moe_only)));
}

std::vector<std::string> moe_only_settings(const CLI::App& dense) {
  JobConfig moe = JobConfig::moe_preset();
  CLI::App moe_app;
  add_job_flags(moe_app, moe);
  std::vector<std::string> out;
  for (const CLI::Option* opt : moe_app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (dense.get_option_no_throw("--" + name) == nullptr) out.push_back(name);
  }
  return out;
}

}  // namespace detail

namespace {

// The first of `extras` (arguments no flag took) that is a flag of the MoE trainer when app is a
// dense trainer's (--ep given to 04_gpt_train), or "".
std::string moe_only_flag(const std::vector<std::string>& extras, const CLI::App& app,
                          const JobConfig& job) {
  if (job.model.mlp == model::MlpKind::moe) return {};
  const std::vector<std::string> moe = detail::moe_only_settings(app);
  for (const std::string& arg : extras) {
    const std::string flag = arg.substr(0, arg.find('='));
    if (flag.rfind("--", 0) == 0 && std::find(moe.begin(), moe.end(), flag.substr(2)) != moe.end())
      return flag;
  }
  return {};
}

}  // namespace

std::optional<int> parse_job_args(const RuntimeConfig& runtime, std::string_view description,
                                  JobConfig* job) {
  job->training.seed = runtime.seed;
  CLI::App app{std::string(description)};
  detail::add_job_flags(app, *job);
  std::vector<const char*> args;
  for (const std::string& a : runtime.remaining_args) args.push_back(a.c_str());
  // Every rank parses the same command line: rank 0 alone prints the help or the error, and a
  // bad flag exits with the one code of every start-up error (2), not the CLI library's own.
  const auto first_rank = [&runtime] {
    try {
      return detect_launch(runtime).rank == 0;
    } catch (const std::exception&) {
      return true;
    }
  };
  const std::string program =
      args.empty() ? std::string("trainer") : std::filesystem::path(args[0]).filename().string();
  try {
    app.parse(static_cast<int>(args.size()), args.data());
    // What the user gave, flags and job-file keys alike (CLI11 counts both), the runtime's
    // flags aside (they are the runtime's).
    job->given.clear();
    for (const CLI::Option* opt : app.get_options()) {
      if (opt->count() > 0 && opt->get_configurable() && !opt->get_lnames().empty() &&
          opt != app.get_config_ptr()) {
        job->given.push_back(opt->get_lnames().front());
      }
    }
    // --init-from-hf: the model is config.json's; a model flag given must agree with it.
    if (!job->checkpoint.init_from_hf.empty()) {
      apply_hf_config(read_hf_config(job->checkpoint.init_from_hf), job,
                      [job](std::string_view flag) { return job->gave(flag); });
    }
  } catch (const CLI::ParseError& e) {
    if (first_rank()) {
      const CLI::Option* config = app.get_config_ptr();
      const std::string moe_flag = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr
                                       ? moe_only_flag(app.remaining(), app, *job)
                                       : std::string();
      if (!moe_flag.empty()) {
        std::fprintf(stderr, "%s: %s is a flag of %s\n", program.c_str(), moe_flag.c_str(),
                     detail::kMoeTrainerOnly);
      } else if (dynamic_cast<const CLI::ConfigError*>(&e) != nullptr && config != nullptr &&
                 config->count() > 0) {
        // The job file's own errors name the file.
        std::fprintf(stderr, "%s: --config %s: %s\n", program.c_str(),
                     config->as<std::string>().c_str(), e.what());
      } else {
        (void)app.exit(e);
      }
    }
    return e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
  } catch (const Error& e) {  // a value a library parse function refused (--schedule 2f2b)
    if (first_rank()) std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

std::string default_dataset_dir(const RuntimeConfig& runtime) {
  namespace fs = std::filesystem;
  if (auto dir = runtime.get_env("QUINTET_DATA_DIR"); dir && !dir->empty()) return *dir;
  if (auto cache = runtime.get_env("XDG_CACHE_HOME"); cache && !cache->empty()) {
    return (fs::path(*cache) / "quintet" / "data").string();
  }
  if (auto home = runtime.get_env("HOME"); home && !home->empty()) {
    return (fs::path(*home) / ".cache" / "quintet" / "data").string();
  }
  return "data";
}

std::string JobConfig::builtin_dataset_dir(const RuntimeConfig& runtime) const {
  return data.dir.empty() ? default_dataset_dir(runtime) : data.dir;
}

std::string job_help(const JobConfig& defaults, std::string_view description) {
  JobConfig job = defaults;
  CLI::App app{std::string(description)};
  detail::add_job_flags(app, job);
  return app.help();
}

std::vector<std::pair<std::string, std::string>> JobConfig::settings() const {
  JobConfig job = *this;
  CLI::App app;
  detail::add_job_flags(app, job);
  std::vector<std::pair<std::string, std::string>> out;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;  // --help's -h aside, every flag has a long name
    const std::string& name = opt->get_lnames().front();
    // Output only (each rank may differ), the help, the job file (its values are what counts)
    // and the runtime's own flags (checked by the runtime), bar the seed.
    if (name == "json" || name == "no-progress" || name == "help" || name == "config" ||
        (!opt->get_configurable() && name != "seed")) {
      continue;
    }
    out.emplace_back("--" + name, opt->get_default_str());
  }
  return out;
}

}  // namespace quintet::train
