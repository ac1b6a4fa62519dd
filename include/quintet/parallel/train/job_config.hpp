// JobConfig: the values of one training job and nothing else (no communicators, no devices):
// the parallel layout, the model, the training (batch, schedule, optimizer, learning rate,
// steps), the data, the checkpoints and what the job reports. Every trainer reads it; the
// library builds from it (TrainingModel(job, mesh, stream)). Implemented by
// parallel/train/job_config*.cpp.
//
// A job comes from a JSON file and command-line flags that override it, in one call:
//
//   const RuntimeConfig runtime = RuntimeConfig::from_args(argc, argv);  // --device, --seed, ...
//   train::JobConfig job;                        // or train::JobConfig::moe_preset()
//   if (auto exit = train::parse_job_args(runtime, "Train a GPT", &job)) return *exit;
//   World world = init(runtime);
//   job.validate(world.size());                  // before any communication
//
//   mpirun -np 4 trainer --config job.json --steps 50     # the file's values, 50 steps
//
// The job file is one flat JSON object whose keys are the flags' names without the dashes, with
// the flags' values: {"layers": 4, "tp": 2, "lr-schedule": "wsd", "sp": true}. An unknown key is
// an error naming it, and the runtime's settings (seed, device, timeout-s, log-level,
// check-collectives) are not taken from it: they are the runtime's (RuntimeConfig).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quintet/core/runtime_config.hpp"
#include "quintet/nn/lr_schedule.hpp"
#include "quintet/nn/optimizer.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"

namespace quintet::train {

struct JobConfig {
  // The layout: tp, cp, ep, etp, dp, pp, vpp (Layout). dp is given (1 by default), not derived:
  // tp x cp x dp x pp must be the world.
  ParallelConfig parallel = ParallelConfig{.dp = 1};
  // --tp-overlap: the tp communication cut into tp_overlap_chunks chunks along the sequence, each
  // under a GEMM (gpt_config() sets model.tp_overlap_chunks from these two).
  bool tp_overlap = false;
  int tp_overlap_chunks = 2;

  // The model: a GPT-2 style model by default (LayerNorm, GELU MLP of 4 x hidden, learned
  // positions, untied head, init std 0.02, f32; a trainer sets bf16 for a GPU). Its
  // sequence_parallel, context_parallel (the cp kind), recompute and, with mlp = moe, its MoE
  // settings are flags too. --arch sets its family (GptConfig::set_family: norm, activation,
  // positions, biases, QK-norm), which --norm, --activation, --positions, --rope-theta,
  // --qk-norm and --no-bias override; an MoE family (mixtral, qwen3-moe) needs an MoE job
  // (moe_preset()), a dense one (llama, qwen3) a dense job.
  model::GptConfig model;

  struct Training {
    // Sequences per forward on each rank, and per optimizer step over all dp ranks: the
    // accumulation (microbatches per step) is global_batch / (micro_batch x dp).
    std::int64_t micro_batch = 4;
    std::int64_t global_batch = 16;
    pipeline::ScheduleKind schedule = pipeline::ScheduleKind::one_f_one_b;
    // How DataParallel reduces each gradient over the ranks that hold its parameter (dp x cp,
    // tp x dp x cp for the sequence-parallel norms, edp for experts); given where those are one
    // rank each, validate() refuses them (zero 0 aside).
    int zero = 0;             // ZeRO stage: 0, 1 or 2
    double bucket_mb = 25.0;  // MiB of f32 gradient per reduction bucket (the first <= 1 MiB)
    bool overlap = true;      // data-parallel reductions during backward (false: after it)
    // AdamW (betas 0.9, 0.95, eps 1e-8) and the learning rate (nn::LrSchedule): a linear warmup
    // to lr, then lr_schedule down to min_lr at the last step (wsd: over the decay_fraction).
    float lr = 1e-3f;
    std::int64_t warmup = 10;
    float min_lr = 1e-4f;
    nn::LrSchedule::Kind lr_schedule = nn::LrSchedule::Kind::cosine;
    double decay_fraction = 0.2;
    float weight_decay = 0.1f;
    float clip = 1.0f;  // the global gradient norm is clipped to this (<= 0: off)
    std::int64_t steps = 100;
    std::int64_t stop_at = 0;    // > 0: stop (and save) after this step; the schedule spans steps
    std::uint64_t seed = 1234;   // the init and the data order (the runtime's --seed)
    bool check_batches = false;  // debug: a stage's tp ranks read the same tokens
  } training;

  struct Data {
    std::string shards;  // a glob of token shards; empty: the built-in dataset
    // Where the built-in dataset is made; empty: default_dataset_dir(), so that every run on a
    // machine shares one copy (builtin_dataset_dir() resolves it). This and synthetic_order are
    // the built-in dataset's: given with shards, validate() refuses them unless the validation
    // data is "builtin".
    std::string dir;
    int synthetic_order = 2;  // built-in dataset: tokens of context that pick the successors
    int loader_threads = 2;
    // Tests and diagnosis (--loader-delay-ms): data::LoaderConfig::read_delay_ms, a slow disk.
    double loader_delay_ms = 0.0;
  } data;

  // Validation (train::Validation, evaluate.hpp): the loss of held-out windows, forward only.
  struct Validation {
    // Token shards (a glob, as --data), or "builtin": the built-in dataset's validation shard;
    // empty: no validation.
    std::string data;
    std::int64_t every = 0;    // > 0: evaluate every N steps (and after the last); 0: the last only
    std::int64_t batches = 0;  // global batches per evaluation (in window order); 0: all there are
    // Evaluate the model once it is initialised (restored with --resume, or read with
    // --init-from-hf) and exit, training nothing and writing nothing.
    bool eval_only = false;
  } validation;

  struct Checkpoint {
    std::string save;              // directory; empty: no checkpoints
    std::int64_t save_every = 0;   // > 0: every N steps (and at the end)
    bool async_save = false;       // written in the background (Checkpointer::save_async)
    int keep_last = 0;             // > 0: only the newest N checkpoints stay (0: every one)
    std::string resume;            // must hold a checkpoint
    std::string resume_if_exists;  // resumes when it holds one, else starts fresh
    // A Hugging Face model directory (hf_checkpoint.hpp): parse_job_args sets the model from its
    // config.json, the trainer loads its weights (not with resume; with resume_if_exists, only
    // when there is no checkpoint to resume).
    std::string init_from_hf;
    // Testing: exit (status 3) in the middle of the save of this step, after its shard is written
    // and before the commit; -1: never.
    std::int64_t exit_during_save = -1;
    // Hugging Face export (hf_export.hpp): the model as a Hub directory at the end of the run,
    // into export_hf; with export_hf_every N also every N steps, each into
    // export_hf/step_NNNNNN (the end's too). export_dtype: f32 (the master weights) or bf16.
    std::string export_hf;
    std::int64_t export_hf_every = 0;
    std::string export_dtype = "f32";
  } checkpoint;

  struct Observe {
    bool json = false;     // one JSON object per step
    bool progress = true;  // a progress bar on a terminal
    bool bench = false;    // medians over the steps after bench_skip
    std::int64_t bench_skip = 5;
    std::string trace;        // a Chrome/Perfetto trace per rank in this directory
    std::string trace_steps;  // "A:B", 1-based and inclusive; empty: 2:4
    // Testing: "KIND:STEP:RANK", rank RANK throws (KIND throw) or stops itself (stop) at the
    // start of step STEP.
    std::string inject_fault;
  } observe;

  // The settings the user gave, by flag name without the dashes ("rope-theta"), on the command
  // line or in the job file (parse_job_args fills it), as against the defaults and a family's
  // values (--arch). validate() refuses a setting given that only matters with another that is
  // off (--rope-theta with learned positions) rather than run as if it were not there. Empty for
  // a job made in code.
  std::vector<std::string> given;
  bool gave(std::string_view flag) const;  // whether `flag` (no dashes) is among given

  // The defaults of a mixture-of-experts trainer (05_moe_train): every block's MLP an MoE of 8
  // experts, top-2 softmax routing (renormalized), dropless, aux-loss 0.01, z-loss 0.001, each
  // exchange cut into 2 chunks. parse_job_args offers the MoE flags for a job whose model.mlp is
  // moe.
  static JobConfig moe_preset();

  // The folder the built-in dataset is made in: data.dir, or default_dataset_dir(runtime).
  std::string builtin_dataset_dir(const RuntimeConfig& runtime) const;

  // Microbatches per step on each rank: global_batch / (micro_batch x dp).
  std::int64_t accumulation() const;
  std::int64_t tokens_per_step() const { return training.global_batch * model.seq_len; }
  // The step after which the run stops: stop_at, or steps.
  std::int64_t last_step() const;
  // Whether the validation loss is evaluated after step (1-based): with validation data, after
  // every validation.every-th step and after the last.
  bool evaluates_after(std::int64_t step) const;
  // Whether the run exports to Hugging Face after `step` (--export-hf at the last step, and every
  // --export-hf-every steps), and where to (hf_export_dir).
  bool exports_hf_at(std::int64_t step) const;
  std::string hf_export_dir(std::int64_t step) const;

  // Throws InvalidArgument, before any communication, unless this job fits `world` ranks: the
  // library's own rules (Layout, GptConfig::validate and validate_experts, split_into_chunks,
  // the pipeline schedule, DataParallelConfig, the learning-rate schedule) and the job's (batch
  // sizes that divide, sp with tp, a resume directory given once, ...). Every message names the
  // setting by its flag and says how to fix it.
  void validate(int world) const;

  // What the library builds from this job (validate() first).
  model::GptConfig gpt_config() const;            // with the tp overlap applied
  pipeline::Schedule pipeline_schedule() const;   // over pp, vpp and accumulation()
  nn::LrSchedule learning_rate_schedule() const;  // over steps
  nn::AdamWConfig optimizer() const;
  data_parallel::DataParallelConfig data_parallel() const;
  // The steps --trace records, [first, last] (1-based), for a run of steps start+1 .. end;
  // empty (first > last) without a trace. Throws InvalidArgument for a malformed trace_steps.
  std::pair<std::int64_t, std::int64_t> traced_steps(std::int64_t start, std::int64_t end) const;

  // Every setting that must be the same on all ranks, by flag name, as text (for
  // check_same_on_all_ranks): all but the output ones (json, progress).
  std::vector<std::pair<std::string, std::string>> settings() const;
};

// The built-in dataset's default home, one per machine and user rather than one per working
// directory: $QUINTET_DATA_DIR, else $XDG_CACHE_HOME/quintet/data, else
// $HOME/.cache/quintet/data, else ./data (the variables as RuntimeConfig read them); the dataset
// of each configuration is made in its own folder below it.
std::string default_dataset_dir(const RuntimeConfig& runtime);

// Parses runtime.remaining_args (the flags RuntimeConfig::from_args left) into *job, whose values
// on entry are the defaults (a preset), the training seed taken from runtime.seed: first the job
// file of --config FILE, then the flags. Offers the MoE flags when job->model.mlp is moe.
// Returns nullopt to go on, or the status the program should exit with: 0 after --help, 2 after
// a bad flag, a bad value or an unreadable file. Only the launch's rank 0 prints the help or the
// error (detect_launch; no communication). description heads the help.
std::optional<int> parse_job_args(const RuntimeConfig& runtime, std::string_view description,
                                  JobConfig* job);

// The --help text of a trainer whose defaults are `defaults` (what parse_job_args prints).
std::string job_help(const JobConfig& defaults, std::string_view description);

}  // namespace quintet::train
