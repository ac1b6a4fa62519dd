// JobConfig::validate: the one check of a job, before any communication (see job_config.hpp).
// The sizes against the world come first with the flags' names; then the library's own checks
// (Layout, GptConfig, split_into_chunks, the schedules, DataParallelConfig) decide the rest, so a
// job the library accepts is never refused here under another rule.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "quintet/core/error.hpp"
#include "quintet/data/synthetic.hpp"
#include "quintet/parallel/model/chunk_spec.hpp"
#include "quintet/parallel/train/hf_export.hpp"
#include "quintet/parallel/train/job_config.hpp"

namespace quintet::train {

namespace {

// tp x cp x dp x pp against the world, named by the flags a user gave.
void validate_world(const ParallelConfig& p, int world) {
  QUINTET_CHECK(p.tp >= 1 && p.cp >= 1 && p.dp >= 1 && p.pp >= 1 && p.vpp >= 1,
                "--tp {} --cp {} --dp {} --pp {} --vpp {}: all must be >= 1", p.tp, p.cp, p.dp,
                p.pp, p.vpp);
  const int ranks = p.tp * p.cp * p.dp * p.pp;
  // ep is carved out of the dense layers' ranks: a user who counts it as another factor is told.
  const std::string ep = p.ep > 1 ? fmt::format(
                                        " (--ep {} adds no ranks: the experts are spread "
                                        "over the ranks --tp, --cp and --dp make)",
                                        p.ep)
                                  : std::string();
  if (p.cp > 1) {
    QUINTET_CHECK(ranks == world,
                  "--tp {} x --cp {} x --dp {} x --pp {} = {} ranks, but the job has {}; launch "
                  "with mpirun -np {} or change the sizes{}",
                  p.tp, p.cp, p.dp, p.pp, ranks, world, ranks, ep);
  } else if (p.pp == 1) {
    QUINTET_CHECK(ranks == world,
                  "--tp {} x --dp {} = {} ranks, but the job has {}; launch with mpirun -np {} or "
                  "change --tp/--dp{}",
                  p.tp, p.dp, ranks, world, ranks, ep);
  } else {
    QUINTET_CHECK(ranks == world,
                  "--tp {} x --dp {} x --pp {} = {} ranks, but the job has {}; launch with mpirun "
                  "-np {} or change --tp/--dp/--pp{}",
                  p.tp, p.dp, p.pp, ranks, world, ranks, ep);
  }
}

void validate_experts(const JobConfig& c, int world) {
  const ParallelConfig& p = c.parallel;
  const int etp = p.etp > 0 ? p.etp : p.tp;
  QUINTET_CHECK(p.ep >= 1 && p.etp >= 0, "--ep {} (>= 1) --etp {} (>= 0)", p.ep, p.etp);
  QUINTET_CHECK(world % (etp * p.ep * p.pp) == 0,
                "--etp {} x --ep {} x --pp {} = {} does not divide the {} ranks: the expert "
                "layers see the ranks as etp x ep x edp x pp",
                etp, p.ep, p.pp, etp * p.ep * p.pp, world);
  QUINTET_CHECK(c.model.moe.overlap_chunks >= 1 && c.model.moe.overlap_chunks <= 64,
                "--moe-chunks {}: expected 1 .. 64", c.model.moe.overlap_chunks);
}

// The built-in dataset's tokens fit the vocabulary (`other`: how to give other data).
void check_builtin_vocab(std::int64_t vocab, const char* other) {
  const int builtin = data::SyntheticConfig{}.vocab_size;
  QUINTET_CHECK(vocab >= builtin,
                "--vocab {}: the built-in dataset has {} tokens; use --vocab >= {} (or {})", vocab,
                builtin, builtin, other);
}

// --val-data, --val-every, --val-batches and --eval-only.
void validate_validation(const JobConfig& c) {
  const JobConfig::Validation& v = c.validation;
  QUINTET_CHECK(v.every >= 0 && v.batches >= 0, "--val-every {} --val-batches {}: expected >= 0",
                v.every, v.batches);
  QUINTET_CHECK(!v.data.empty() || (v.every == 0 && v.batches == 0 && !v.eval_only),
                "{} needs --val-data GLOB (the validation shards, or builtin)",
                v.eval_only   ? std::string("--eval-only")
                : v.every > 0 ? fmt::format("--val-every {}", v.every)
                              : fmt::format("--val-batches {}", v.batches));
  QUINTET_CHECK(!v.eval_only || !c.checkpoint.resume.empty() || !c.checkpoint.init_from_hf.empty(),
                "--eval-only evaluates a trained model: give it with --resume DIR or "
                "--init-from-hf DIR");
  if (v.data == "builtin") check_builtin_vocab(c.model.vocab, "other --val-data");
  QUINTET_CHECK(!v.eval_only || c.checkpoint.save.empty(),
                "--eval-only writes nothing: drop --save {}", c.checkpoint.save);
  QUINTET_CHECK(!v.eval_only || c.checkpoint.export_hf.empty(),
                "--eval-only writes nothing: drop --export-hf {}", c.checkpoint.export_hf);
  QUINTET_CHECK(!v.eval_only || c.observe.trace.empty(),
                "--eval-only runs no step to trace: drop --trace {}", c.observe.trace);
  QUINTET_CHECK(!v.eval_only || !c.gave("val-every"),
                "--val-every {} needs training (it evaluates between steps), and --eval-only "
                "evaluates once and runs no step; drop --val-every",
                v.every);
}

// A setting the user gave (JobConfig::given) that only matters with another one that is off:
// refused, naming both, rather than run as if not given. A default or a family's value (--arch
// llama's rope-theta with --positions learned) is let be.
void validate_given(const JobConfig& c) {
  const model::GptConfig& m = c.model;
  const JobConfig::Training& t = c.training;
  QUINTET_CHECK(!c.gave("rope-theta") || m.rope,
                "--rope-theta {} needs --positions rope (RoPE's base; this model's positions "
                "are learned)",
                m.rope_theta);
  QUINTET_CHECK(!c.gave("fp8-amax-history") || m.fp8.scaling == nn::Fp8Scaling::delayed,
                "--fp8-amax-history {} needs --fp8-scaling delayed (current scaling keeps no "
                "history)",
                m.fp8.amax_history);
  QUINTET_CHECK(!c.gave("cp-kind") || c.parallel.cp > 1,
                "--cp-kind needs --cp > 1 (how attention spans the cp ranks; --cp 1 has none)");
  QUINTET_CHECK(!c.gave("tp-overlap-chunks") || c.tp_overlap,
                "--tp-overlap-chunks {} needs --tp-overlap (the chunks of the overlapped tp "
                "communication)",
                c.tp_overlap_chunks);
  QUINTET_CHECK(!c.gave("decay-fraction") || t.lr_schedule == nn::LrSchedule::Kind::wsd,
                "--decay-fraction {} needs --lr-schedule wsd (the share of the steps that decay; "
                "--lr-schedule {} has none)",
                t.decay_fraction, nn::lr_schedule_kind_name(t.lr_schedule));
  QUINTET_CHECK(!c.gave("min-lr") || t.lr_schedule != nn::LrSchedule::Kind::constant,
                "--min-lr {} needs a decaying --lr-schedule (cosine, linear or wsd): constant "
                "stays at --lr",
                t.min_lr);
  QUINTET_CHECK(!c.gave("bench-skip") || c.observe.bench,
                "--bench-skip {} needs --bench (the warm-up steps its medians leave out)",
                c.observe.bench_skip);
  // The built-in dataset's settings, when --data replaces it and --val-data does not read it.
  if (!c.data.shards.empty() && c.validation.data != "builtin") {
    QUINTET_CHECK(!c.gave("synthetic-order"),
                  "--synthetic-order {} needs the built-in dataset (the Markov order of its "
                  "tokens), and --data {} trains on other data; drop one of them (or read the "
                  "built-in one with --val-data builtin)",
                  c.data.synthetic_order, c.data.shards);
    QUINTET_CHECK(!c.gave("data-dir"),
                  "--data-dir {} needs the built-in dataset (where it is made), and --data {} "
                  "trains on other data; drop one of them (or read the built-in one with "
                  "--val-data builtin)",
                  c.data.dir, c.data.shards);
  }
}

// --zero, --bucket-mb and --no-overlap settle how DataParallel reduces each gradient over the
// ranks that hold its parameter: dp x cp, tp x dp x cp for the sequence-parallel norms (--sp),
// edp for the experts. Given where every such group is one rank (a validated layout), they change
// nothing: refused, naming what gives the groups ranks. (--zero 0 asks for nothing: let be.)
void validate_data_parallel(const JobConfig& c, int world) {
  const ParallelConfig& p = c.parallel;
  const bool moe = c.model.mlp == model::MlpKind::moe;
  if (p.dp * p.cp > 1 || (c.model.sequence_parallel && p.tp > 1) || (moe && p.edp(world) > 1)) {
    return;
  }
  const auto refuse_given = [&](const char* flag, const std::string& given, const char* what) {
    QUINTET_CHECK(!c.gave(flag),
                  "{} needs --dp > 1: it {}, and at --dp 1 --cp 1{}{} each gradient is reduced "
                  "over one rank alone",
                  given, what,
                  p.tp > 1 ? fmt::format(" with --tp {} without --sp", p.tp) : std::string(),
                  moe ? " (and each expert's over edp 1)" : "");
  };
  if (c.training.zero != 0) {
    refuse_given("zero", fmt::format("--zero {}", c.training.zero),
                 "shards the optimizer state over the ranks that reduce a gradient");
  }
  refuse_given("bucket-mb", fmt::format("--bucket-mb {}", c.training.bucket_mb),
               "sizes the buckets of the gradient reductions");
  refuse_given("no-overlap", "--no-overlap", "runs the gradient reductions after backward");
}

}  // namespace

void JobConfig::validate(int world) const {
  const ParallelConfig& p = parallel;
  const model::GptConfig& m = model;
  const Training& t = training;
  validate_world(p, world);
  // A trainer's flags are those of its MLP kind (the MoE flags with an MoE job): a family of the
  // other kind would be refused by GptConfig::validate under its field names.
  QUINTET_CHECK(m.family == model::ModelFamily::gpt2 ||
                    model::is_moe_family(m.family) == (m.mlp == model::MlpKind::moe),
                "--arch {}: a {} family, and this trainer's model is {}; {}",
                model::model_family_name(m.family),
                model::is_moe_family(m.family) ? "mixture-of-experts" : "dense",
                m.mlp == model::MlpKind::moe ? "a mixture of experts" : "dense",
                model::is_moe_family(m.family)
                    ? "train it with the MoE trainer (05_moe_train, JobConfig::moe_preset())"
                    : "train it with the dense trainer (04_gpt_train, JobConfig{})");
  if (p.cp > 1) {
    QUINTET_CHECK(m.seq_len % (2 * p.cp) == 0,
                  "--seq-len {} is not divisible by 2 x --cp {} = {}: context parallelism cuts "
                  "each sequence into 2 * cp equal chunks",
                  m.seq_len, p.cp, 2 * p.cp);
  }
  QUINTET_CHECK(m.layers >= std::int64_t{p.pp} * p.vpp,
                "--layers {} cannot fill --pp {} x --vpp {} = {} pipeline chunks (each needs a "
                "layer; uneven cuts are fine); use --layers >= {} or fewer chunks",
                m.layers, p.pp, p.vpp, p.pp * p.vpp, p.pp * p.vpp);
  QUINTET_CHECK(!m.sequence_parallel || p.tp > 1,
                "--sp needs --tp > 1 (sequence parallelism splits over tp)");
  QUINTET_CHECK(!m.sequence_parallel || (m.seq_len / p.cp) % p.tp == 0,
                "--seq-len {} is not divisible by --tp {}: sequence parallelism splits the "
                "sequence evenly; choose a multiple of {}",
                m.seq_len, p.tp, p.tp);
  QUINTET_CHECK(!m.fp8_lm_head || m.fp8.mode != nn::Fp8Mode::off,
                "--fp8-lm-head needs --fp8 hybrid (the LM head's FP8 follows its recipe)");
  QUINTET_CHECK(m.fp8.scaling == nn::Fp8Scaling::current || m.fp8.mode != nn::Fp8Mode::off,
                "--fp8-scaling delayed needs --fp8 hybrid (without it nothing is in FP8)");
  if (m.fp8.mode != nn::Fp8Mode::off) {
    QUINTET_CHECK(m.fp8.amax_history >= 1, "--fp8-amax-history {}: expected a count >= 1",
                  m.fp8.amax_history);
    QUINTET_CHECK(p.cp == 1,
                  "--fp8 hybrid with --cp {}: each cp rank would scale its chunks of a sequence "
                  "apart; FP8 takes --cp 1 for now",
                  p.cp);
  }
  QUINTET_CHECK(tp_overlap_chunks >= 1, "--tp-overlap-chunks {}: expected a count >= 1",
                tp_overlap_chunks);
  QUINTET_CHECK(!tp_overlap || p.tp > 1,
                "--tp-overlap needs --tp > 1 (it overlaps the tp communication with GEMMs)");
  QUINTET_CHECK(!t.check_batches || p.tp > 1,
                "--check-batches needs --tp > 1 (it checks that the tp ranks read the same "
                "tokens)");
  if (tp_overlap && p.tp > 1 && m.seq_len % p.cp == 0) {
    const std::int64_t local = m.seq_len / p.cp / (m.sequence_parallel ? p.tp : 1);
    QUINTET_CHECK(local % tp_overlap_chunks == 0,
                  "--tp-overlap-chunks {} does not divide each rank's sequence of {} tokens "
                  "(--seq-len {}{}{}); choose a count that divides {}",
                  tp_overlap_chunks, local, m.seq_len,
                  p.cp > 1 ? fmt::format(" / --cp {}", p.cp) : std::string(),
                  m.sequence_parallel ? fmt::format(" / --tp {}", p.tp) : std::string(), local);
  }
  QUINTET_CHECK(checkpoint.resume.empty() || checkpoint.init_from_hf.empty(),
                "--resume {} and --init-from-hf {}: a resumed run has its weights already; give "
                "one of them (--resume-if-exists starts from --init-from-hf when there is no "
                "checkpoint)",
                checkpoint.resume, checkpoint.init_from_hf);
  QUINTET_CHECK(checkpoint.resume.empty() || checkpoint.resume_if_exists.empty(),
                "--resume {} and --resume-if-exists {}: give one of them", checkpoint.resume,
                checkpoint.resume_if_exists);
  QUINTET_CHECK(t.zero >= 0 && t.zero <= 2, "--zero {}: expected 0, 1 or 2", t.zero);
  QUINTET_CHECK(t.bucket_mb > 0 && t.bucket_mb <= 1 << 20,
                "--bucket-mb {}: expected a size in MiB above 0 (the default is 25)", t.bucket_mb);
  QUINTET_CHECK(m.layers >= 1 && m.hidden >= 1 && m.heads >= 1 && m.vocab >= 2 && m.seq_len >= 1,
                "--layers {} --hidden {} --heads {} --vocab {} --seq-len {}: sizes must be "
                "positive (vocab >= 2)",
                m.layers, m.hidden, m.heads, m.vocab, m.seq_len);
  QUINTET_CHECK(
      t.micro_batch >= 1 && t.global_batch > 0 && t.global_batch % (t.micro_batch * p.dp) == 0,
      "--global-batch {} must be a positive multiple of --micro-batch {} x --dp {} = {}",
      t.global_batch, t.micro_batch, p.dp, t.micro_batch * p.dp);
  QUINTET_CHECK(t.steps >= 1 && t.warmup >= 0, "--steps {} (>= 1) --warmup {} (>= 0)", t.steps,
                t.warmup);
  QUINTET_CHECK(t.lr > 0 && t.min_lr >= 0 && t.min_lr <= t.lr,
                "--lr {} --min-lr {}: need lr > 0 and 0 <= min-lr <= lr", t.lr, t.min_lr);
  QUINTET_CHECK(t.decay_fraction > 0 && t.decay_fraction <= 1,
                "--decay-fraction {}: expected a share in (0, 1]", t.decay_fraction);
  validate_given(*this);
  learning_rate_schedule().validate();
  QUINTET_CHECK(t.stop_at >= 0 && t.stop_at <= t.steps, "--stop-at {}: expected 0 .. --steps {}",
                t.stop_at, t.steps);
  QUINTET_CHECK(checkpoint.save_every >= 0, "--save-every {}: expected >= 0",
                checkpoint.save_every);
  QUINTET_CHECK(checkpoint.save_every == 0 || !checkpoint.save.empty(),
                "--save-every {} needs --save DIR", checkpoint.save_every);
  QUINTET_CHECK(checkpoint.keep_last >= 0, "--keep-last {}: expected >= 0 (0 keeps every one)",
                checkpoint.keep_last);
  QUINTET_CHECK(checkpoint.keep_last == 0 || !checkpoint.save.empty(),
                "--keep-last {} needs --save DIR", checkpoint.keep_last);
  QUINTET_CHECK(!checkpoint.async_save || !checkpoint.save.empty(),
                "--async-save needs --save DIR (it writes the checkpoints in the background)");
  QUINTET_CHECK(checkpoint.exit_during_save < 0 || !checkpoint.save.empty(),
                "--exit-during-save {} needs --save DIR (it exits in the middle of a save)",
                checkpoint.exit_during_save);
  QUINTET_CHECK(checkpoint.export_hf_every >= 0, "--export-hf-every {}: expected >= 0",
                checkpoint.export_hf_every);
  QUINTET_CHECK(checkpoint.export_hf_every == 0 || !checkpoint.export_hf.empty(),
                "--export-hf-every {} needs --export-hf DIR", checkpoint.export_hf_every);
  const DType export_dtype = parse_hf_export_dtype(checkpoint.export_dtype);
  QUINTET_CHECK(export_dtype == DType::f32 || !checkpoint.export_hf.empty(),
                "--export-dtype {} needs --export-hf DIR (the dtype of the exported weights)",
                checkpoint.export_dtype);
  if (!checkpoint.export_hf.empty()) {
    // The model has a Hugging Face layout and the directory is free: refused now, not after
    // training. With --export-hf-every, DIR holds one directory per export.
    HfExportOptions o;
    o.dtype = export_dtype;
    if (checkpoint.export_hf_every == 0) {
      check_hf_export(m, checkpoint.export_hf, o);
    } else {
      hf_architecture(m);
      QUINTET_CHECK(!std::filesystem::exists(checkpoint.export_hf) ||
                        std::filesystem::is_directory(checkpoint.export_hf),
                    "--export-hf {}: exists and is not a directory", checkpoint.export_hf);
    }
  }
  QUINTET_CHECK(data.loader_threads >= 1, "--loader-threads {}: expected >= 1",
                data.loader_threads);
  QUINTET_CHECK(std::isfinite(data.loader_delay_ms) && data.loader_delay_ms >= 0.0,
                "--loader-delay-ms {}: expected a time >= 0", data.loader_delay_ms);
  if (data.shards.empty()) check_builtin_vocab(m.vocab, "--data");
  validate_validation(*this);
  QUINTET_CHECK(observe.trace_steps.empty() || !observe.trace.empty(),
                "--trace-steps {} needs --trace DIR", observe.trace_steps);
  (void)traced_steps(0, t.steps);  // a malformed --trace-steps, named
  if (m.mlp == model::MlpKind::moe) validate_experts(*this, world);
  // The library's own rules, as its builders apply them: the layout (etp, vpp with a pipeline,
  // the order), the model against tp and cp and its experts against ep and etp, the cut into
  // pipeline chunks, the schedule (its microbatches, vpp) and the data-parallel settings.
  p.validate(world);
  validate_data_parallel(*this, world);
  const model::GptConfig built = gpt_config();
  built.validate(p.tp, p.cp);
  built.validate_experts(p.ep, p.etp > 0 ? p.etp : p.tp);
  const pipeline::Schedule schedule = pipeline_schedule();
  (void)model::split_into_chunks(built, schedule.num_stages());
  data_parallel().validate();
}

}  // namespace quintet::train
