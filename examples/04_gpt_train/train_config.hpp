// The configuration of one GPT training run: every flag of 04_gpt_train, parsed by CLI11.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "quintet/core/runtime_config.hpp"
#include "quintet/nn/lr_schedule.hpp"
#include "quintet/parallel/model/gpt_config.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"

namespace gpt {

// The same sources build two programs: 04_gpt_train (dense GPT) and, with QUINTET_MOE_TRAINER
// defined, 05_moe_train, whose blocks' MLPs are mixtures of experts (the MoE flags below).
#ifdef QUINTET_MOE_TRAINER
inline constexpr bool kMoeTrainer = true;
inline constexpr const char* kProgram = "05_moe_train";
#else
inline constexpr bool kMoeTrainer = false;
inline constexpr const char* kProgram = "04_gpt_train";
#endif

struct TrainConfig {
  // Model.
  std::int64_t layers = 2;
  std::int64_t hidden = 128;
  std::int64_t heads = 4;
  std::int64_t vocab = 256;  // the built-in dataset's vocabulary
  std::int64_t seq_len = 128;
  bool tied_embeddings = false;    // the LM head reuses the token embedding's table
  std::string recompute = "none";  // none, attention, full (activation recompute per block)
  // Batch: global_batch = micro_batch * dp * accumulation steps (sequences per optimizer step).
  std::int64_t micro_batch = 4;
  std::int64_t global_batch = 16;
  // Layout.
  int tp = 1;
  int cp = 1;                    // context parallel: ranks that split each sequence
  std::string cp_kind = "ring";  // ring or ulysses
  int dp = 1;
  int pp = 1;                     // pipeline stages (ranks)
  int vpp = 1;                    // model chunks per pipeline rank
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved, zb-h1, zb-v
  bool sp = false;                // sequence parallelism (needs tp > 1)
  bool tp_overlap = false;        // tp communication in chunks under the GEMMs
  int tp_overlap_chunks = 2;      // chunks of each rank's sequence (with --tp-overlap)
  int zero = 0;                   // 0, 1 or 2
  double bucket_mb = 25.0;  // MiB of f32 gradient per reduction bucket after the first (1 MiB)
  // Optimizer and schedule (nn::LrSchedule): linear warmup to lr, then lr_schedule (cosine,
  // linear, wsd: decay to min_lr at the last step; constant).
  float lr = 1e-3f;
  std::int64_t warmup = 10;
  float min_lr = 1e-4f;
  std::string lr_schedule = "cosine";
  double decay_fraction = 0.2;  // wsd: the share of the post-warmup steps that decay
  float weight_decay = 0.1f;
  float clip = 1.0f;
  std::int64_t steps = 100;
  std::int64_t stop_at = 0;  // > 0: stop (and save) after this step; the schedule still spans steps
  std::uint64_t seed = 1234;  // from the runtime's --seed (QUINTET_SEED)
  // Data: a glob of token shards; empty = the built-in synthetic dataset (made in data_dir).
  std::string data;
  std::string data_dir = "data/synthetic";
  int synthetic_order = 2;  // built-in dataset: tokens of context that pick the successors
  int loader_threads = 2;
  // Checkpoints.
  std::string save;
  std::int64_t save_every = 0;
  bool async_save = false;       // write checkpoints in the background (Checkpointer::save_async)
  std::string resume;            // must hold a checkpoint
  std::string resume_if_exists;  // resumes when it holds one, else starts fresh
  // Fault injection for the checkpoint test: the process exits (status 3) in the middle of the
  // save of this step, after its shard is written and before the checkpoint is committed.
  std::int64_t exit_during_save = -1;
  // Fault injection for the reliability tests: "KIND:STEP:RANK" makes rank RANK, at the start of
  // step STEP, throw an error (KIND throw) or stop itself with SIGSTOP (KIND stop).
  std::string inject_fault;
  // Mixture of experts (05_moe_train; 04_gpt_train has none of these flags).
  std::int64_t experts = 8;        // experts per MoE block
  int top_k = 2;                   // experts per token
  int ep = 1;                      // expert parallel: ranks that hold different experts
  int etp = 0;                     // expert tensor parallel: ranks that split each expert; 0 = tp
  float capacity_factor = 0.0f;    // 0 = dropless
  std::string router = "softmax";  // softmax or sigmoid scores
  float aux_loss_coeff = 0.01f;
  float z_loss_coeff = 0.001f;
  float aux_free_bias_rate = 0.0f;  // auxiliary-loss-free balancing (0 = off)
  int shared_experts = 0;
  std::int64_t expert_ffn = 0;  // each expert's width; 0 = 4 * hidden
  int moe_every = 1;            // block l is MoE when l % moe_every == 0
  int moe_chunks = 2;           // token chunks whose exchange overlaps the experts' compute
  // Measurement and output.
  bool no_overlap = false;
  bool check_batches = false;  // debug: the tp ranks of a stage hold the same tokens
  bool bench = false;
  std::int64_t bench_skip = 5;  // steps left out of the --bench medians (warm-up)
  bool json = false;
  bool progress = true;  // progress bar on a terminal (rank 0)
  // --trace DIR: a Chrome/Perfetto trace per rank (DIR/trace_rank<r>.json) of the steps
  // --trace-steps A:B (1-based, inclusive; default 2:4, clamped to the steps run).
  std::string trace;
  std::string trace_steps;

  // Microbatches per step on each rank (the pipeline's microbatches).
  std::int64_t accumulation() const { return global_batch / (micro_batch * dp); }
  std::int64_t tokens_per_step() const { return global_batch * seq_len; }
  // The steps --trace records, [first, last] (1-based), for a run of steps start+1 .. end; empty
  // (first > last) without --trace. Throws InvalidArgument for a malformed --trace-steps.
  std::pair<std::int64_t, std::int64_t> traced_steps(std::int64_t start, std::int64_t end) const;
};

// Every setting that must be the same on all ranks, by flag name, as text (for
// quintet::check_same_on_all_ranks at start-up). Output settings (--json, --progress) may differ.
std::vector<std::pair<std::string, std::string>> shared_settings(const TrainConfig& config);

// Parses the flags the runtime left (runtime.remaining_args: --device, --seed, --timeout-s and
// --log-level are the runtime's, read by RuntimeConfig::from_args) into config; seed and device
// come from runtime. Returns false (after CLI11 printed help or an error) when the program should
// exit with *exit_code.
bool parse_args(const quintet::RuntimeConfig& runtime, TrainConfig* config, int* exit_code);

// Rejects inconsistent settings (batch sizes that do not divide, sp without tp, ...) with a
// quintet::Error naming the flag and how to fix it. world is the number of ranks.
void validate(const TrainConfig& config, int world);

// The library model these flags describe: a GPT-2 style model (LayerNorm, GELU MLP of 4 * hidden,
// learned positions, LM head untied unless --tied-embeddings, init std 0.02), bf16 on GPUs and f32
// on the CPU.
quintet::model::GptConfig model_config(const TrainConfig& config, bool gpu);

// The pipeline schedule these flags ask for (--schedule over --pp, --vpp and accumulation()
// microbatches); throws InvalidArgument stating the schedule's rule when they break it.
quintet::pipeline::Schedule pipeline_schedule(const TrainConfig& config);

// The learning-rate schedule these flags describe (the library's nn::LrSchedule over --steps),
// and its rate at step (0-based).
quintet::nn::LrSchedule lr_schedule(const TrainConfig& config);
float learning_rate(const TrainConfig& config, std::int64_t step);

}  // namespace gpt
