#include "train_config.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <string>

#include "quintet/collectives/bootstrap.hpp"  // detect_launch: this rank, before init
#include "quintet/core/error.hpp"

namespace gpt {

bool parse_args(const quintet::RuntimeConfig& runtime, TrainConfig* c, int* exit_code) {
  CLI::App app{kMoeTrainer ? "Train a mixture-of-experts GPT under any dp x tp (+sp) x ep x pp x "
                             "cp layout, on CPU or GPU"
                           : "Train a GPT model under any dp x tp (+sp) layout, on CPU or GPU"};
  // A flag given twice takes its last value, so wrappers (scripts/demo.sh) can be overridden.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--layers", c->layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", c->hidden, "model width")->capture_default_str();
  app.add_option("--heads", c->heads, "attention heads")->capture_default_str();
  app.add_option("--vocab", c->vocab, "vocabulary size (>= the dataset's)")->capture_default_str();
  app.add_option("--seq-len", c->seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--recompute", c->recompute,
                 "activation recompute: none, attention (each block's attention) or full (each "
                 "whole block): less memory for one more forward")
      ->capture_default_str();
  app.add_flag("--tied-embeddings", c->tied_embeddings,
               "the LM head reuses the token embedding's table (across pipeline stages too)");
  app.add_option("--micro-batch", c->micro_batch, "sequences per rank per forward")
      ->capture_default_str();
  app.add_option("--global-batch", c->global_batch,
                 "sequences per optimizer step over all dp ranks (accumulation follows)")
      ->capture_default_str();
  app.add_option("--tp", c->tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--dp", c->dp, "data-parallel size (tp * cp * dp * pp = ranks)")
      ->capture_default_str();
  app.add_option("--cp", c->cp, "context-parallel size: ranks that split each sequence")
      ->capture_default_str();
  app.add_option("--cp-kind", c->cp_kind,
                 "how attention spans the cp ranks: ring (K/V around a ring) or ulysses "
                 "(all-to-all to a head split)")
      ->capture_default_str();
  app.add_option("--pp", c->pp, "pipeline-parallel size (stages)")->capture_default_str();
  app.add_option("--vpp", c->vpp, "model chunks per pipeline rank (interleaved, zb-v)")
      ->capture_default_str();
  app.add_option("--schedule", c->schedule,
                 "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v")
      ->capture_default_str();
  app.add_flag("--sp", c->sp, "sequence parallelism (with --tp > 1)");
  app.add_flag("--tp-overlap", c->tp_overlap,
               "cut the tp communication into chunks along the sequence, each overlapping a GEMM");
  app.add_option("--tp-overlap-chunks", c->tp_overlap_chunks,
                 "with --tp-overlap: chunks of each rank's sequence (seq-len / cp, / tp with --sp)")
      ->capture_default_str();
  app.add_option("--zero", c->zero, "ZeRO stage: 0, 1 or 2")->capture_default_str();
  app.add_option("--lr", c->lr, "peak learning rate")->capture_default_str();
  app.add_option("--warmup", c->warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--min-lr", c->min_lr, "learning rate at the last step (decaying schedules)")
      ->capture_default_str();
  app.add_option("--lr-schedule", c->lr_schedule,
                 "after warmup: cosine, linear, wsd (warmup-stable-decay) or constant")
      ->capture_default_str();
  app.add_option("--decay-fraction", c->decay_fraction,
                 "wsd: the share of the steps after warmup that decay to --min-lr")
      ->capture_default_str();
  app.add_option("--weight-decay", c->weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--clip", c->clip, "clip the global gradient norm to this (<= 0: off)")
      ->capture_default_str();
  app.add_option("--steps", c->steps, "optimizer steps")->capture_default_str();
  app.add_option("--stop-at", c->stop_at,
                 "stop (and save, with --save) after this step; the schedule still spans --steps "
                 "(for jobs cut into pieces by a time limit)");
  // Read by the runtime (RuntimeConfig::from_args); listed here for --help.
  std::string runtime_flag;
  app.add_option("--seed", runtime_flag, "seed of the init and the data order (default 1234)");
  app.add_option("--device", runtime_flag, "cpu or cuda (default: cuda when a GPU is visible)");
  app.add_option("--timeout-s", runtime_flag, "bound on communicator setup and waits");
  app.add_option("--log-level", runtime_flag, "debug, info, warn, error, off");
  bool runtime_switch = false;
  app.add_flag("--check-collectives", runtime_switch,
               "debug mode: the ranks compare every collective's fingerprint before it is sent "
               "(or QUINTET_CHECK_COLLECTIVES=1)");
  app.add_option("--data", c->data, "token shards (glob); default: the built-in dataset");
  app.add_option("--data-dir", c->data_dir, "where the built-in dataset is made")
      ->capture_default_str();
  app.add_option("--synthetic-order", c->synthetic_order,
                 "built-in dataset: Markov order (1 is learnt in minutes on a CPU)")
      ->capture_default_str();
  app.add_option("--loader-threads", c->loader_threads, "data loader threads per rank")
      ->capture_default_str();
  app.add_option("--save", c->save, "checkpoint directory");
  app.add_flag("--async-save", c->async_save,
               "write checkpoints in the background while training goes on");
  app.add_option("--save-every", c->save_every, "save every N steps (and at the end)")
      ->capture_default_str();
  app.add_option("--resume", c->resume,
                 "resume from the latest checkpoint in this directory (an error when it holds "
                 "none)");
  app.add_option("--resume-if-exists", c->resume_if_exists,
                 "resume from the latest checkpoint in this directory when there is one, else "
                 "start fresh");
  app.add_option("--exit-during-save", c->exit_during_save,
                 "testing: exit midway through the save of this step")
      ->group("");
  app.add_option("--inject-fault", c->inject_fault,
                 "testing: KIND:STEP:RANK, rank RANK throws (KIND throw) or stops itself (stop) "
                 "at the start of step STEP")
      ->group("");
  app.add_option("--bucket-mb", c->bucket_mb,
                 "MiB of gradient per data-parallel bucket (the first is at most 1 MiB)")
      ->capture_default_str();
  app.add_flag("--no-overlap", c->no_overlap,
               "run data-parallel communication after backward, not during it");
  app.add_flag("--check-batches", c->check_batches,
               "debug: verify every step that the tensor-parallel ranks read the same tokens");
  app.add_flag("--bench", c->bench, "report medians over the steps after --bench-skip");
  app.add_option("--bench-skip", c->bench_skip, "warm-up steps left out of --bench")
      ->capture_default_str();
  if (kMoeTrainer) {
    app.add_option("--experts", c->experts, "experts per MoE block")->capture_default_str();
    app.add_option("--top-k", c->top_k, "experts per token (1..8)")->capture_default_str();
    app.add_option("--ep", c->ep, "expert-parallel size: ranks that hold different experts")
        ->capture_default_str();
    app.add_option("--etp", c->etp,
                   "expert-tensor-parallel size: ranks that split each expert (0: --tp)")
        ->capture_default_str();
    app.add_option("--capacity-factor", c->capacity_factor,
                   "tokens an expert takes, over the even share (0: dropless)")
        ->capture_default_str();
    app.add_option("--router", c->router, "router scores: softmax or sigmoid")
        ->capture_default_str();
    app.add_option("--aux-loss-coeff", c->aux_loss_coeff, "load-balancing loss coefficient")
        ->capture_default_str();
    app.add_option("--z-loss-coeff", c->z_loss_coeff, "router z-loss coefficient")
        ->capture_default_str();
    app.add_option("--aux-free-bias-rate", c->aux_free_bias_rate,
                   "auxiliary-loss-free balancing: the per-step bias update (0: off)")
        ->capture_default_str();
    app.add_option("--shared-experts", c->shared_experts,
                   "width of a shared MLP every token takes, in experts")
        ->capture_default_str();
    app.add_option("--expert-ffn", c->expert_ffn, "each expert's width (0: 4 x hidden)")
        ->capture_default_str();
    app.add_option("--moe-every", c->moe_every, "every N-th block is MoE (from block 0)")
        ->capture_default_str();
    app.add_option("--moe-chunks", c->moe_chunks,
                   "token chunks per MoE exchange: chunk c+1 travels while chunk c's experts "
                   "compute (1: no overlap)")
        ->capture_default_str();
  }
  app.add_flag("--json", c->json, "one JSON object per step");
  app.add_option("--trace", c->trace,
                 "write a Chrome/Perfetto trace of each rank to DIR/trace_rank<r>.json "
                 "(scripts/merge_traces.py merges them)");
  app.add_option("--trace-steps", c->trace_steps,
                 "the steps --trace records, A:B (1-based, inclusive; default 2:4)");
  app.add_flag("!--no-progress", c->progress, "no progress bar");
  std::vector<const char*> args;
  for (const std::string& a : runtime.remaining_args) args.push_back(a.c_str());
  c->seed = runtime.seed;
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same command line: rank 0 alone prints the help or the error, and a
    // bad flag exits with the one code of every start-up error (2), not the CLI library's own.
    int rank = 0;
    try {
      rank = quintet::detect_launch(runtime).rank;
    } catch (const std::exception&) {
    }
    if (rank == 0) (void)app.exit(e);
    *exit_code = e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
    return false;
  }
  return true;
}

std::vector<std::pair<std::string, std::string>> shared_settings(const TrainConfig& c) {
  auto s = [](const auto& v) { return fmt::format("{}", v); };
  return {{"--layers", s(c.layers)},
          {"--hidden", s(c.hidden)},
          {"--heads", s(c.heads)},
          {"--vocab", s(c.vocab)},
          {"--seq-len", s(c.seq_len)},
          {"--tied-embeddings", s(c.tied_embeddings)},
          {"--recompute", c.recompute},
          {"--micro-batch", s(c.micro_batch)},
          {"--global-batch", s(c.global_batch)},
          {"--tp", s(c.tp)},
          {"--cp", s(c.cp)},
          {"--cp-kind", c.cp_kind},
          {"--dp", s(c.dp)},
          {"--pp", s(c.pp)},
          {"--vpp", s(c.vpp)},
          {"--schedule", c.schedule},
          {"--sp", s(c.sp)},
          {"--tp-overlap", s(c.tp_overlap)},
          {"--tp-overlap-chunks", s(c.tp_overlap_chunks)},
          {"--zero", s(c.zero)},
          {"--bucket-mb", s(c.bucket_mb)},
          {"--lr", s(c.lr)},
          {"--warmup", s(c.warmup)},
          {"--min-lr", s(c.min_lr)},
          {"--lr-schedule", c.lr_schedule},
          {"--decay-fraction", s(c.decay_fraction)},
          {"--weight-decay", s(c.weight_decay)},
          {"--clip", s(c.clip)},
          {"--steps", s(c.steps)},
          {"--stop-at", s(c.stop_at)},
          {"--seed", s(c.seed)},
          {"--data", c.data},
          {"--data-dir", c.data_dir},
          {"--synthetic-order", s(c.synthetic_order)},
          {"--save", c.save},
          {"--save-every", s(c.save_every)},
          {"--async-save", s(c.async_save)},
          {"--resume", c.resume},
          {"--resume-if-exists", c.resume_if_exists},
          {"--no-overlap", s(c.no_overlap)},
          {"--check-batches", s(c.check_batches)},
          {"--bench", s(c.bench)},
          {"--trace", c.trace},
          {"--trace-steps", c.trace_steps},
          {"--experts", s(c.experts)},
          {"--top-k", s(c.top_k)},
          {"--ep", s(c.ep)},
          {"--etp", s(c.etp)},
          {"--capacity-factor", s(c.capacity_factor)},
          {"--router", c.router},
          {"--aux-loss-coeff", s(c.aux_loss_coeff)},
          {"--z-loss-coeff", s(c.z_loss_coeff)},
          {"--aux-free-bias-rate", s(c.aux_free_bias_rate)},
          {"--shared-experts", s(c.shared_experts)},
          {"--expert-ffn", s(c.expert_ffn)},
          {"--moe-every", s(c.moe_every)}};
}

void validate(const TrainConfig& c, int world) {
  QUINTET_CHECK(c.tp >= 1 && c.cp >= 1 && c.dp >= 1 && c.pp >= 1 && c.vpp >= 1,
                "--tp {} --cp {} --dp {} --pp {} --vpp {}: all must be >= 1", c.tp, c.cp, c.dp,
                c.pp, c.vpp);
  if (c.cp > 1) {
    QUINTET_CHECK(c.tp * c.cp * c.dp * c.pp == world,
                  "--tp {} x --cp {} x --dp {} x --pp {} = {} ranks, but the job has {}; launch "
                  "with mpirun -np {} or change the sizes",
                  c.tp, c.cp, c.dp, c.pp, c.tp * c.cp * c.dp * c.pp, world,
                  c.tp * c.cp * c.dp * c.pp);
    QUINTET_CHECK(c.seq_len % (2 * c.cp) == 0,
                  "--seq-len {} is not divisible by 2 x --cp {} = {}: context parallelism cuts "
                  "each sequence into 2 * cp equal chunks",
                  c.seq_len, c.cp, 2 * c.cp);
    (void)quintet::context::parse_context_parallel_kind(c.cp_kind);
  } else if (c.pp == 1) {
    QUINTET_CHECK(c.tp * c.dp == world,
                  "--tp {} x --dp {} = {} ranks, but the job has {}; launch with mpirun -np {} or "
                  "change --tp/--dp",
                  c.tp, c.dp, c.tp * c.dp, world, c.tp * c.dp);
  } else {
    QUINTET_CHECK(c.tp * c.dp * c.pp == world,
                  "--tp {} x --dp {} x --pp {} = {} ranks, but the job has {}; launch with mpirun "
                  "-np {} or change --tp/--dp/--pp",
                  c.tp, c.dp, c.pp, c.tp * c.dp * c.pp, world, c.tp * c.dp * c.pp);
  }
  QUINTET_CHECK(c.layers % (c.pp * c.vpp) == 0,
                "--layers {} is not divisible by --pp {} x --vpp {} = {} pipeline chunks; the "
                "layers are split evenly over the chunks",
                c.layers, c.pp, c.vpp, c.pp * c.vpp);
  QUINTET_CHECK(!c.sp || c.tp > 1, "--sp needs --tp > 1 (sequence parallelism splits over tp)");
  QUINTET_CHECK(!c.sp || (c.seq_len / c.cp) % c.tp == 0,
                "--seq-len {} is not divisible by --tp {}: sequence parallelism splits the "
                "sequence evenly; choose a multiple of {}",
                c.seq_len, c.tp, c.tp);
  QUINTET_CHECK(c.tp_overlap_chunks >= 1, "--tp-overlap-chunks {}: expected a count >= 1",
                c.tp_overlap_chunks);
  if (c.tp_overlap && c.tp > 1 && c.cp >= 1 && c.seq_len % c.cp == 0) {
    const std::int64_t local = c.seq_len / c.cp / (c.sp ? c.tp : 1);
    QUINTET_CHECK(local % c.tp_overlap_chunks == 0,
                  "--tp-overlap-chunks {} does not divide each rank's sequence of {} tokens "
                  "(--seq-len {}{}{}); choose a count that divides {}",
                  c.tp_overlap_chunks, local, c.seq_len,
                  c.cp > 1 ? fmt::format(" / --cp {}", c.cp) : std::string(),
                  c.sp ? fmt::format(" / --tp {}", c.tp) : std::string(), local);
  }
  QUINTET_CHECK(c.resume.empty() || c.resume_if_exists.empty(),
                "--resume {} and --resume-if-exists {}: give one of them", c.resume,
                c.resume_if_exists);
  QUINTET_CHECK(c.zero >= 0 && c.zero <= 2, "--zero {}: expected 0, 1 or 2", c.zero);
  QUINTET_CHECK(c.bucket_mb > 0 && c.bucket_mb <= 1 << 20,
                "--bucket-mb {}: expected a size in MiB above 0 (the default is 25)", c.bucket_mb);
  QUINTET_CHECK(c.layers >= 1 && c.hidden >= 1 && c.heads >= 1 && c.vocab >= 2 && c.seq_len >= 1,
                "--layers {} --hidden {} --heads {} --vocab {} --seq-len {}: sizes must be "
                "positive (vocab >= 2)",
                c.layers, c.hidden, c.heads, c.vocab, c.seq_len);
  QUINTET_CHECK(
      c.micro_batch >= 1 && c.global_batch % (c.micro_batch * c.dp) == 0 && c.global_batch > 0,
      "--global-batch {} must be a positive multiple of --micro-batch {} x --dp {} = {}",
      c.global_batch, c.micro_batch, c.dp, c.micro_batch * c.dp);
  QUINTET_CHECK(c.steps >= 1 && c.warmup >= 0, "--steps {} (>= 1) --warmup {} (>= 0)", c.steps,
                c.warmup);
  QUINTET_CHECK(c.lr > 0 && c.min_lr >= 0 && c.min_lr <= c.lr,
                "--lr {} --min-lr {}: need lr > 0 and 0 <= min-lr <= lr", c.lr, c.min_lr);
  QUINTET_CHECK(c.decay_fraction > 0 && c.decay_fraction <= 1,
                "--decay-fraction {}: expected a share in (0, 1]", c.decay_fraction);
  lr_schedule(c).validate();  // an unknown --lr-schedule, named
  QUINTET_CHECK(c.stop_at >= 0 && c.stop_at <= c.steps, "--stop-at {}: expected 0 .. --steps {}",
                c.stop_at, c.steps);
  QUINTET_CHECK(c.save_every >= 0, "--save-every {}: expected >= 0", c.save_every);
  QUINTET_CHECK(c.save_every == 0 || !c.save.empty(), "--save-every {} needs --save DIR",
                c.save_every);
  QUINTET_CHECK(c.loader_threads >= 1, "--loader-threads {}: expected >= 1", c.loader_threads);
  QUINTET_CHECK(c.trace_steps.empty() || !c.trace.empty(), "--trace-steps {} needs --trace DIR",
                c.trace_steps);
  (void)c.traced_steps(0, c.steps);  // a malformed --trace-steps, named
  if (kMoeTrainer) {
    const int etp = c.etp > 0 ? c.etp : c.tp;
    QUINTET_CHECK(c.ep >= 1 && c.etp >= 0, "--ep {} (>= 1) --etp {} (>= 0)", c.ep, c.etp);
    QUINTET_CHECK(world % (etp * c.ep * c.pp) == 0,
                  "--etp {} x --ep {} x --pp {} = {} does not divide the {} ranks: the expert "
                  "layers see the ranks as etp x ep x edp x pp",
                  etp, c.ep, c.pp, etp * c.ep * c.pp, world);
    QUINTET_CHECK(c.ep <= c.dp * c.cp * c.tp / etp,
                  "--ep {} is more than the {} ranks of a pipeline stage over --etp {}", c.ep,
                  c.tp * c.cp * c.dp, etp);
    QUINTET_CHECK(c.moe_chunks >= 1 && c.moe_chunks <= 64, "--moe-chunks {}: expected 1 .. 64",
                  c.moe_chunks);
    (void)quintet::expert::parse_router_score(c.router);
  }
  // The model's own checks (heads, vocabulary and MLP width against tp, experts against ep and
  // etp) and the schedule's rules (its microbatches, vpp), before any communicator exists.
  const quintet::model::GptConfig m = model_config(c, /*gpu=*/false);
  m.validate(c.tp, c.cp);
  m.validate_experts(c.ep, c.etp > 0 ? c.etp : c.tp);
  pipeline_schedule(c);
}

quintet::pipeline::Schedule pipeline_schedule(const TrainConfig& c) {
  const quintet::pipeline::ScheduleKind kind = quintet::pipeline::parse_schedule_kind(c.schedule);
  return quintet::pipeline::make_schedule(kind, c.pp, c.vpp, static_cast<int>(c.accumulation()));
}

quintet::model::GptConfig model_config(const TrainConfig& c, bool gpu) {
  quintet::model::GptConfig m;
  m.layers = c.layers;
  m.hidden = c.hidden;
  m.heads = c.heads;
  m.ffn_hidden = 4 * c.hidden;
  m.vocab = c.vocab;
  m.seq_len = c.seq_len;
  m.norm = quintet::nn::NormKind::layernorm;
  m.activation = quintet::nn::Activation::gelu;
  m.bias = true;
  m.tied_embeddings = c.tied_embeddings;
  m.learned_positions = true;
  m.init_std = 0.02f;
  m.dtype = gpu ? quintet::DType::bf16 : quintet::DType::f32;
  m.sequence_parallel = c.sp;
  m.tp_overlap_chunks = c.tp_overlap ? c.tp_overlap_chunks : 1;
  m.recompute = quintet::model::parse_recompute_kind(c.recompute);
  m.context_parallel = quintet::context::parse_context_parallel_kind(c.cp_kind);
  if (kMoeTrainer) {
    m.mlp = quintet::model::MlpKind::moe;
    quintet::expert::RouterConfig& r = m.moe.router;
    r.experts = c.experts;
    r.top_k = c.top_k;
    r.score = quintet::expert::parse_router_score(c.router);
    r.renormalize = c.top_k > 1;  // top-1 keeps the raw probability, so the router learns
    r.capacity_factor = c.capacity_factor;
    r.aux_loss_coeff = c.aux_loss_coeff;
    r.z_loss_coeff = c.z_loss_coeff;
    r.bias_rate = c.aux_free_bias_rate;
    m.moe.expert_ffn = c.expert_ffn;
    m.moe.shared_experts = c.shared_experts;
    m.moe.every = c.moe_every;
    m.moe.overlap_chunks = c.moe_chunks;
  }
  return m;
}

quintet::nn::LrSchedule lr_schedule(const TrainConfig& c) {
  quintet::nn::LrSchedule s;
  s.kind = quintet::nn::parse_lr_schedule_kind(c.lr_schedule);
  s.peak_lr = c.lr;
  s.min_lr = c.min_lr;
  s.warmup_steps = c.warmup;
  s.total_steps = c.steps;
  s.decay_fraction = c.decay_fraction;
  return s;
}

float learning_rate(const TrainConfig& c, std::int64_t step) { return lr_schedule(c).at(step); }

std::pair<std::int64_t, std::int64_t> TrainConfig::traced_steps(std::int64_t start,
                                                                std::int64_t end) const {
  if (trace.empty()) return {1, 0};
  std::int64_t a = 2, b = 4;
  if (!trace_steps.empty()) {
    const std::size_t colon = trace_steps.find(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < trace_steps.size();
    if (ok) {
      try {
        std::size_t used_a = 0, used_b = 0;
        a = std::stoll(trace_steps.substr(0, colon), &used_a);
        b = std::stoll(trace_steps.substr(colon + 1), &used_b);
        ok = used_a == colon && used_b == trace_steps.size() - colon - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    QUINTET_CHECK(ok && a >= 1 && a <= b,
                  "--trace-steps {}: expected A:B with 1 <= A <= B (1-based steps, inclusive)",
                  trace_steps);
  }
  return {std::max(a, start + 1), std::min(b, end)};
}

}  // namespace gpt
