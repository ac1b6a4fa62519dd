// The mixture-of-experts layer (parallel/expert/moe_layer.cpp): the MLP slot of a transformer
// block, with its experts spread over the expert-parallel (ep) group and each expert optionally
// split over the expert-tensor-parallel (etp) group. Three parts, as Megatron-Core's moe_layer /
// token_dispatcher / experts, each in its own file:
//   Router           (router.hpp)            scores, top-k, capacity, balancing, step statistics
//   TokenDispatcher  (token_dispatcher.hpp)  permutation, count exchange, chunked all-to-all,
//                                            un-permutation and combine
//   Experts          (experts.hpp)           the expert MLPs, GELU or SwiGLU
// and an optional dense shared MLP.
//
// x [B, S', d] -> y [B, S', d] (S' = S, or S/tp with sequence parallelism, or a cp rank's share):
//   1. the Router routes every token of x (logits in f32, top-k, weights, capacity);
//   2. the TokenDispatcher takes the tokens this rank dispatches (all of x; without sequence
//      parallelism and tp > 1 each tp rank takes its 1/tp of the B*S' tokens, which must divide)
//      to the ep (and etp) ranks of their experts, in overlap_chunks chunks;
//   3. the Experts run on each chunk's rows, each projection one grouped GEMM over every local
//      expert (experts.hpp): GELU (fc, proj) or SwiGLU (fc = gate, up, proj) MLPs of width
//      expert_ffn, without biases;
//   4. the TokenDispatcher brings the results back and sums them per token weighted by the
//      router's weights; without sequence parallelism the tp ranks all-gather their shares, so y
//      is the same on every tp rank;
//   5. with shared experts, a dense tensor-parallel MLP of width shared_experts * expert_ffn
//      (ParallelMLP, "shared.*") that every token goes through is added.
// Forward saves one typed handle (the router's, the dispatcher's and each chunk's experts'
// activations, by name); backward mirrors forward and adds the aux-loss and z-loss gradients
// into the router's, scaled by ctx.loss_scale(). Experts and whole ranks that receive no tokens
// are ordinary cases: their GEMMs are skipped and their collectives still run, so every rank of ep
// and etp makes the same calls.
//
// Parameters, in this order: router.weight [E, d] (Router), experts.fc.weight, experts.up.weight
// (SwiGLU), experts.proj.weight (Experts: expert parameters, whose gradients data parallelism
// reduces over edp), shared.* (the shared MLP). The auxiliary-loss-free bias is state, not a
// parameter: balance_bias() and set_balance_bias() (checkpoints save it).
//
// Statistics: every forward adds this microbatch's expert load, drops, aux loss and z loss to the
// layer's step counters (not when recomputing or evaluating: nn::Context::counts_statistics);
// finish_step() sums them over the ranks of the pipeline stage, updates the balancing bias from
// the step's load, and starts a new step. When an expert has received no token for
// router.idle_warning_steps consecutive steps, finish_step warns once (log::warn on the stage's
// first rank, naming the layer and the idle experts): routing has collapsed, and the balancing
// settings are what to change.
//
// Devices: CPU tensors (f32 or f64) or CUDA tensors (bf16 or f32). On a GPU the router (scores,
// top-k, weights and the load-balancing statistics in one pass), the permutation fused with the
// gather of the rows and the un-permutation fused with the combine are the nn ops'
// (nn::moe_route_forward, nn::moe_permute, nn::moe_unpermute and their backward) and the
// experts' projections nn::grouped_linear_*'s.
//
// Host synchronisations (quintet::host_sync_count), where the host waits for the device:
//   - forward, with an exchange (ep > 1, or etp > 1): once, the copy of the exchanged counts to
//     the host (token_dispatcher.hpp: they size the rows' exchange and the experts' GEMMs);
//   - forward at ep = etp = 1: never; there is no count exchange, and the experts' grouped GEMMs
//     read their rows' offsets on the device (FP8's grouped GEMMs too);
//   - backward: never;
//   - the step's counters (the load per expert, the aux and z sums) stay on the device, summed
//     there microbatch after microbatch, until the step ends: finish_step waits once for them;
//     reduce_step_counters does not wait, and the trainer's step reads them with the loss in its
//     one synchronisation (parallel/train/step.cpp). Moving the balancing bias uploads it from
//     pinned memory, without a wait.
// Not thread-safe; the communicators must outlive the layer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/expert/experts.hpp"
#include "quintet/parallel/expert/router.hpp"
#include "quintet/parallel/expert/token_dispatcher.hpp"
#include "quintet/parallel/tensor_parallel/mlp.hpp"

namespace quintet::expert {

// The communicators of an MoE layer (borrowed). tp is required (a one-rank communicator for none);
// cp, ep and etp may be null (one rank). With etp > 1 the etp group's ranks hold the same experts
// (the same ep rank), as Layout's expert groups do.
struct MoEGroups {
  Communicator* tp = nullptr;
  Communicator* cp = nullptr;
  Communicator* ep = nullptr;
  Communicator* etp = nullptr;
  // Every rank of the pipeline stage (Axis::tp_dp_cp): the experts' FP8 amaxes are reduced over
  // it (experts.hpp). Required with fp8, unused without.
  Communicator* stage = nullptr;
};

struct MoEOptions {
  RouterConfig router;
  std::int64_t expert_ffn = 0;  // each expert's width F (required)
  nn::Activation activation = nn::Activation::gelu;
  int shared_experts = 0;       // width of the shared MLP in experts (0 = none)
  float init_std = 0.02f;       // router, fc, up
  float proj_init_std = 0.02f;  // proj
  bool sequence_parallel = false;
  // The tokens a rank dispatches go in this many chunks (near-equal, consecutive; the same on
  // every rank): chunk c + 1's all_to_all_v runs while chunk c's experts compute, and chunk c's
  // results return during chunk c + 1's compute, in forward and backward. 1 = one exchange each
  // way, nothing overlapped. Without an ep exchange (ep = 1) there is nothing to overlap and the
  // tokens go in one chunk. The result does not depend on it (up to the order of the weight
  // gradients' sums).
  int overlap_chunks = 1;
  // mode hybrid: the experts' GEMMs in FP8 with per-tensor scales (experts.hpp; scaling state
  // "experts.fc.fp8_x", "experts.fc.fp8_w", "experts.fc.fp8_dy", "experts.up.fp8_w",
  // "experts.up.fp8_dy" (SwiGLU), "experts.proj.fp8_x", "experts.proj.fp8_w",
  // "experts.proj.fp8_dy"; the grouped FP8 GEMMs of grouped_linear.hpp) and the shared MLP's
  // linear layers as the tp layers do (cuBLASLt's FP8 GEMMs on a GPU); the exact emulation on
  // the CPU.
  nn::Fp8Recipe fp8{};
};

class MoELayer : public nn::Module {
 public:
  // Throws InvalidArgument (before any communication) for a bad router config, experts not
  // divisible by ep, expert_ffn not divisible by etp, a missing tp communicator, or FP8 with a
  // bad recipe or without a stage communicator.
  MoELayer(const MoEGroups& groups, std::int64_t dim, const MoEOptions& options);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

  const MoEOptions& options() const { return options_; }
  std::int64_t local_experts() const { return experts_->local_experts(); }
  // The three parts.
  const Router& router() const { return *router_; }
  const TokenDispatcher& dispatcher() const { return *dispatcher_; }
  const Experts& experts() const { return *experts_; }
  // The balancing bias [E] f32 (zero without bias_rate), the same on every rank.
  const Tensor& balance_bias() const { return router_->balance_bias(); }
  void set_balance_bias(const std::vector<float>& values) { router_->set_balance_bias(values); }

  // Sums this step's counters over `stage` (every rank of the pipeline stage: Axis::tp_dp_cp of
  // the dense layout, collective; on stream, the host waits), updates the balancing bias when
  // bias_rate > 0, warns once about experts idle for router.idle_warning_steps steps, resets the
  // counters, and returns the step's statistics. The same as reduce_step_counters and
  // finish_steps (below) for this layer alone.
  MoEStats finish_step(Communicator& stage, const Stream& stream = Stream());

  // The end of a step in two halves, for reducing many layers' counters at once:
  // counters_size() values, [load (E), assignments, aux sum, z sum, microbatches].
  std::int64_t counters_size() const { return router_->counters_size(); }
  // Ends this step's counting: appends the counters to host with the device's as 0, and returns
  // those ([E + 2] f64 on the layer's device: the load, to be put at offsets 0..E, and the aux and
  // z sums, at E + 1 and E + 2; undefined when no forward ran). The next step counts from zero.
  // No host synchronisation.
  Tensor take_counters(std::vector<double>& host) { return router_->take_counters(host); }
  // From the counters summed over stage (counters_size() values, in take_counters' order): the
  // step's statistics; moves the balancing bias when bias_rate > 0 (its device copy on stream)
  // and warns about idle experts (on the stage's rank 0). Local.
  MoEStats finish_step(const double* summed, const Communicator& stage, const Stream& stream) {
    return router_->finish_step(summed, stage, stream);
  }

 private:
  // Declares the experts' FP8 scaling state (options.fp8 on) and returns their Fp8Linears.
  ExpertsFp8 experts_fp8(const MoEOptions& options, Communicator* stage);

  std::int64_t dim_;
  MoEOptions options_;
  std::optional<Router> router_;
  std::optional<Experts> experts_;
  std::optional<TokenDispatcher> dispatcher_;
  tensor_parallel::ParallelMLP* shared_ = nullptr;
};

// The step counters of every layer in layers (take_counters) in one f64 tensor on stream's device,
// [layer 0's counters_size() values, layer 1's, ...], summed over stage (the ranks of the pipeline
// stage, as in finish_step) in ONE all-reduce: queued on stream, the host does not wait (the host
// values go up from pinned memory). Keep the result until the host has waited for the stream;
// read `summed` on the host then (one synchronisation for the whole model) and give it to
// finish_steps.
struct StepCounters {
  Tensor summed;   // f64 on the stream's device
  Tensor staging;  // the pinned host buffer summed was uploaded from (alive until the upload ran)
};
StepCounters reduce_step_counters(const std::vector<MoELayer*>& layers, Communicator& stage,
                                  const Stream& stream = Stream());
// Each layer's finish_step from reduce_step_counters' result over stage, copied to the host (CPU
// tensor of the sum of their counters_size()). Throws InvalidArgument when it is not that.
std::vector<MoEStats> finish_steps(const std::vector<MoELayer*>& layers, const Tensor& counters,
                                   const Communicator& stage, const Stream& stream = Stream());

// Sums the statistics of several layers' finish_step (their loads concatenated).
MoEStats combine(const std::vector<MoEStats>& layers);

// A step's MoE telemetry over every MoE layer of the model: the tokens per expert (kept
// assignments; the minimum, mean and maximum over every expert of every layer), the fraction of
// assignments dropped, and the aux and z losses summed over the layers.
struct MoESummary {
  int layers = 0;
  double min_load = 0.0, mean_load = 0.0, max_load = 0.0;
  double dropped_fraction = 0.0;
  double aux_loss = 0.0, z_loss = 0.0;
};
// Combines this rank's layers' statistics (finish_step of the stages it holds) over pp, where
// each stage holds other layers (collective over pp; on stream, the host waits). The same on
// every rank.
MoESummary summarize(const std::vector<MoEStats>& layers, Communicator& pp,
                     const Stream& stream = Stream());

}  // namespace quintet::expert
