// What the trainer reports: one record per step (printed as a line or a JSON object), a progress
// bar with ETA on a terminal, and a summary with medians at the end.
//
// Communication figures of a step (all on this rank, rank 0 prints):
//   comm_ms           data-parallel communication time, hidden or not (DataParallel's stats).
//   tp_comm_ms        exposed tensor-parallel communication: the sum over the step's tp collectives
//                     of the time the compute stream stalled in waiting for them (TimedCommunicator
//                     with Measure::from_wait: from a mark just before the wait to one just after).
//                     Compute run between issue and wait (the column-parallel backward overlaps
//                     dx's all-reduce with dW) is hidden communication and not counted. 0 at tp
//                     = 1.
//   tp_ops            tensor-parallel collectives issued in the step (each overlap chunk is one).
//   cp_comm_ms        exposed context-parallel communication (the ring's K/V and dK/dV
//                     transfers, or the all-to-alls), measured the same way. 0 at cp = 1.
//   ep_comm_ms        exposed expert-parallel communication (the MoE count and token exchanges),
//                     measured the same way. 0 at ep = 1.
//   exposed_comm_pct  100 * (dp exposed ms + tp_comm_ms + cp_comm_ms + ep_comm_ms + pp exposed
//                     ms) / step ms.
//   comm (per kind)   for each of dp, tp, pp, ep and cp: comm_ms, the time its operations were in
//                     flight (the union from issue to completion: DataParallelStats::comm_ms for
//                     dp, TimedCommunicator::Stats::comm_ms for the others); exposed_ms, the time
//                     the compute stream (CPU: thread) waited on them (dp: DataParallel's exposed
//                     intervals; the others from the wait, as tp_comm_ms), at most comm_ms (a
//                     larger value is the two clocks' skew and is cut there); and hidden_ms =
//                     comm_ms - exposed_ms, the part that ran under compute.
//
// bound_by: what the step's time went to (quintet/parallel/train/bound_by.hpp): compute, exposed
// communication per kind, input, host, other, largest first, adding up to the step. In every JSON
// step record and, over the measured steps, at the end (a line, or the summary's "bound_by").
//
// MoE telemetry (05_moe_train): tokens per expert (kept assignments in the step, over every expert
// of every MoE block: min, mean, max), the fraction of assignments dropped by the capacity, and
// the aux and z losses (summed over the blocks, coefficients included; not in `loss`).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quintet/parallel/train/bound_by.hpp"  // StepTimes, the verdict
#include "quintet/parallel/train/evaluate.hpp"  // Validation::Result
#include "quintet/parallel/train/step.hpp"      // StepStats

namespace gpt {

struct MoeRecord {
  double min_load = 0.0, mean_load = 0.0, max_load = 0.0;
  double dropped_fraction = 0.0;
  double aux_loss = 0.0, z_loss = 0.0;
};

// One kind of communication in a step (see the header comment).
struct KindComm {
  double comm_ms = 0.0;
  double exposed_ms = 0.0;
  double hidden_ms = 0.0;
  double measured_exposed_ms = 0.0;  // exposed before the cut at comm_ms (the tests bound the cut)
};
// From measured in-flight and exposed times: exposed cut at comm, hidden the rest.
KindComm kind_comm(double comm_ms, double exposed_ms);
inline constexpr std::array<const char*, 5> kCommKinds = {"dp", "tp", "pp", "ep", "cp"};

struct StepRecord {
  std::int64_t step = 0;                // 1-based: the optimizer step just taken
  double loss = 0.0;                    // mean cross-entropy over the global batch (nats/token)
  std::optional<double> entropy_floor;  // the dataset's, when it records one
  double lr = 0.0;
  double grad_norm = 0.0;           // global, before clipping
  double ms = 0.0;                  // wall time of the step
  double tokens_per_s = 0.0;        // global batch tokens / step time
  std::optional<double> mfu;        // GPU only: model FLOP/s over 989 TFLOP/s per GPU
  std::optional<double> tflops;     // GPU only: model TFLOP/s per GPU
  double exposed_comm_pct = 0.0;    // exposed dp + tp communication, % of the step (see above)
  double comm_ms = 0.0;             // data-parallel communication time (hidden or not)
  double tp_comm_ms = 0.0;          // exposed tensor-parallel communication (see above)
  std::int64_t tp_ops = 0;          // tensor-parallel collectives issued (more with --tp-overlap)
  double cp_comm_ms = 0.0;          // exposed context-parallel communication (see above)
  double ep_comm_ms = 0.0;          // exposed expert-parallel communication (see above)
  std::array<KindComm, 5> comm;     // per kind, in kCommKinds order
  std::optional<MoeRecord> moe;     // 05_moe_train
  std::int64_t peak_mem_bytes = 0;  // peak device memory (GPU) or resident set (CPU)
  std::int64_t grad_mem_bytes = 0;  // the most gradient storage held at once (ZeRO-2: shards)
  quintet::train::StepTimes times;  // the bound-by verdict's figures
};

// The record of optimizer step `step` (1-based) from what it did (StepStats) and the time the
// trainer measured around it (ms, for tokens_per_step tokens): everything but entropy_floor and
// the device figures (tflops, mfu, peak_mem_bytes). moe: the MoE record too.
StepRecord step_record(std::int64_t step, const quintet::train::StepStats& stats, double lr,
                       double ms, std::int64_t tokens_per_step, bool moe);

// Model FLOPs per token for training (forward + backward): 6 N + 12 L d T, N the non-embedding
// parameters a token runs through (MoE: the router, its top-k experts and the shared ones), L
// layers, d width, T sequence length (attention scores and values).
double flops_per_token(std::int64_t non_embedding_params, std::int64_t layers, std::int64_t hidden,
                       std::int64_t seq_len);

// Dense bf16 peak of one H200 (and H100 SXM), the MFU denominator.
constexpr double kPeakFlopsPerGpu = 989e12;

class Reporter {
 public:
  // Prints only when active (rank 0). json: one object per step instead of a text line.
  Reporter(bool active, bool json, bool progress, std::int64_t total_steps);
  void step(const StepRecord& r);
  // A checkpoint save after step: how long the trainer was held by it (async: the snapshot
  // only) and, before it, by the previous background save still writing.
  void saved(std::int64_t step, bool async, double ms, double waited_ms) const;
  // The validation loss after step (0: before any): a line, or {"val_step", "val_loss",
  // "val_windows", "val_ms"}.
  void validation(std::int64_t step, const quintet::train::Validation::Result& r) const;
  // The peak memory before the first step (start-up: GPU allocator peak or resident set), for
  // the whole run's peak in the summary.
  void set_start_peak(std::int64_t bytes) { start_peak_ = bytes; }
  // The model's parameters (GptConfig::total_params, non_embedding_params), for the JSON
  // summary: a PyTorch peer of the same model (scripts/bench) is compared on them.
  void set_params(std::int64_t total, std::int64_t non_embedding) {
    params_ = total;
    non_embedding_params_ = non_embedding;
  }
  // Median figures over records after skip (all records when too few), then a summary line.
  // Peak memory: the most a measured step reached (peak_mem_bytes) and the whole run's.
  void summary(std::int64_t skip) const;
  // With --check-collectives: how many operations this rank compared with the other ranks and
  // found matching (quintet::checked_operations()), the evidence that the check ran.
  void checked_collectives(std::int64_t operations) const;
  const std::vector<StepRecord>& records() const { return records_; }

 private:
  void draw_progress(const StepRecord& r) const;
  bool active_, json_, progress_;
  std::int64_t total_;
  std::vector<StepRecord> records_;
  std::int64_t start_peak_ = 0;
  std::int64_t params_ = 0, non_embedding_params_ = 0;
};

// Peak resident memory of this process in bytes (CPU runs).
std::int64_t peak_rss_bytes();

}  // namespace gpt
