// The router of a mixture-of-experts layer: which experts each token goes to, with which combine
// weights, and the load-balancing terms. Two levels:
//   - functions on f32 tensors (T tokens, E experts, k experts per token), in
//     parallel/expert/router.cpp: route (the fused routing op with the capacity), the aux loss
//     from its statistics and its gradient's scale, the load's sum, the bias update;
//   - class Router (parallel/expert/router_layer.cpp, at the end of this header), the MoE layer's
//     routing part, composed by MoELayer (moe_layer.hpp) with its TokenDispatcher and Experts: it
//     owns the router's weight, the balancing bias and the step's statistics, and calls them.
// Device-generic: CPU tensors are computed in place, CUDA tensors by kernels queued on `stream`
// without a host synchronisation. Routing and its backward run as the fused nn ops
// (nn::moe_route_forward / moe_route_backward, quintet/nn/ops.hpp: one pass computes the scores,
// the selection, the weights, the aux loss's statistics and the z loss's sum; the backward adds
// the aux and z terms); the tests check them against plain f64 references
// (tests/support/route_reference.hpp). The two kernels of this level (the aux loss from its
// statistics, the load's sum) are in parallel/expert/cuda/moe_kernels.cu.
//
// Scores: probs = softmax(logits) over the E experts, or sigmoid(logits) elementwise.
// Selection: the k experts with the largest probs + bias (bias: the auxiliary-loss-free balancing
// bias, DeepSeek-V3 style, used for selection only; ties go to the lower expert index), listed in
// order of decreasing selection score.
// Weights: probs at the selected experts; with renormalize, divided by their sum over the k.
// Capacity: with capacity_factor > 0 each expert takes at most C = ceil(capacity_factor * T * k /
// E) of the T tokens it is given; beyond C, the assignments with the lowest probs are dropped
// (ties: the later token is dropped). A dropped assignment keeps its place in `experts` but has
// kept = 0 and weight 0 (its token gets nothing from that expert). capacity_factor = 0 is
// dropless.
//
// Load balancing, over groups of tokens (the MoE layer uses one group per sequence):
//   aux loss  (Switch / GShard form): per group g of n_g tokens,
//             L_g = E * sum_e f_ge * P_ge,  f_ge = (selected assignments of g to e) / (n_g * k),
//             P_ge = mean over g's tokens of probs[t, e]; the loss is aux_loss_coeff * mean_g L_g.
//             Balanced routing gives aux_loss_coeff. f is a count and carries no gradient.
//   z loss    z_loss_coeff * mean_t logsumexp(logits_t)^2 (ST-MoE): the fused op's z sum with
//             RouteOptions::z_scale = z_loss_coeff / T.
//   bias      after each step, bias_e += bias_rate * sign(mean load - load_e), with the load
//             counted over the whole step (update_balance_bias).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::expert {

using RouterScore = nn::RouteScore;  // softmax or sigmoid
// "softmax" or "sigmoid"; InvalidArgument for anything else.
RouterScore parse_router_score(std::string_view name);

struct RouterConfig {
  std::int64_t experts = 8;
  int top_k = 2;  // 1 <= top_k <= min(8, experts)
  RouterScore score = RouterScore::softmax;
  bool renormalize = true;       // the k weights of a token sum to one
  float capacity_factor = 0.0f;  // 0 = dropless
  // Balancing is on by default: the aux loss at 0.01, as Mixtral / Qwen3-MoE style models train
  // (without any, routing collapses: experts that get no token and never learn). 0 = off, e.g.
  // for auxiliary-loss-free balancing by bias_rate alone.
  float aux_loss_coeff = 0.01f;
  float z_loss_coeff = 0.0f;
  float bias_rate = 0.0f;  // auxiliary-loss-free balancing; 0 = off (no bias)
  // The MoE layer warns once (log::warn, on the stage's first rank) when an expert has received
  // no token for this many consecutive steps (MoELayer::finish_step); 0 = never.
  std::int64_t idle_warning_steps = 50;

  // Throws InvalidArgument naming the field unless experts >= 1, 1 <= top_k <= 8, top_k <=
  // experts, the factors and coefficients are finite and >= 0, and idle_warning_steps >= 0.
  void validate() const;
  // C for `tokens` tokens (capacity_factor > 0), or 0 (dropless: unlimited).
  std::int64_t capacity(std::int64_t tokens) const;
};

struct Routing {
  Tensor probs;              // [T, E] f32: the scores
  Tensor experts;            // [T, k] i32: the selected experts, by decreasing selection score
  Tensor weights;            // [T, k] f32: combine weights (0 where dropped)
  Tensor kept;               // [T, k] u8: 1 unless the capacity dropped the assignment
  std::int64_t dropped = 0;  // assignments dropped (CPU; -1 on a GPU: count `kept` instead)
};

// logits [T, E] f32; bias [E] f32 on the same device, or undefined (no bias).
Routing route(const Tensor& logits, const Tensor& bias, const RouterConfig& config,
              const Stream& stream = Stream());
// The options of nn::moe_route_forward / moe_route_backward for config (no statistics).
nn::RouteOptions route_options(const RouterConfig& config);
// Routing from the fused op's output, with config's capacity applied (nn::moe_drop_over_capacity_).
Routing apply_capacity(const nn::RouteOutput& routed, const RouterConfig& config,
                       const Stream& stream = Stream());

// Adds counts [E] i64 (kept assignments per expert: moe_permute's counts) into acc [E] f64, on
// their device without a host wait: a step's load, kept on the device until the step ends.
void accumulate_load(const Tensor& counts, const Tensor& acc, const Stream& stream = Stream());

// The aux loss's statistics of `groups` equal groups of consecutive tokens: selected-assignment
// counts and sums of probs per group and expert, [groups, E] f32 each (nn::moe_route_forward's
// counts and prob_sum with RouteOptions::groups). They add up over ranks holding parts of the same
// groups (all-reduce them, sum, before the loss).
struct AuxStats {
  Tensor counts;    // [G, E] f32
  Tensor prob_sum;  // [G, E] f32
};
// aux_loss_coeff * mean_g L_g of whole-group statistics, with group_tokens tokens per group, added
// into acc, a [1] f64 tensor on the statistics' device (no host wait).
void accumulate_aux_loss(const AuxStats& stats, std::int64_t group_tokens,
                         const RouterConfig& config, const Tensor& acc,
                         const Stream& stream = Stream());
// d(scale * aux loss) / d(probs[t, e]) = aux_grad_factor(...) * counts[group of t, e], for G groups
// of group_tokens tokens (the aux_scale of nn::moe_route_backward).
double aux_grad_factor(const RouterConfig& config, std::int64_t groups, std::int64_t group_tokens,
                       float scale);

// One step of auxiliary-loss-free balancing: bias_e += rate * sign(mean(load) - load_e), with
// load the kept assignments per expert over the step (summed over every rank). bias [E] f32 CPU.
void update_balance_bias(const Tensor& bias, const std::vector<double>& load, float rate);

// A step's statistics of one or more MoE layers, summed over the ranks that ran them.
struct MoEStats {
  std::vector<double> load;  // kept assignments per expert (layers concatenated)
  double assignments = 0.0;  // routed assignments (tokens x k), dropped included
  double dropped = 0.0;      // assignments dropped by the capacity
  double aux_loss = 0.0;     // mean over microbatches and ranks (coefficient included)
  double z_loss = 0.0;       // the same
  double min_load() const;
  double mean_load() const;
  double max_load() const;
  double dropped_fraction() const { return assignments > 0 ? dropped / assignments : 0.0; }
};

// One forward's routing, for its backward.
struct RouterHandle {
  Tensor x;                     // [T, d]: the layer's input rows
  Tensor logits;                // [T, E] f32
  Routing routing;              // scores, experts, weights, kept of the T tokens
  Tensor lse;                   // [T] f32: logsumexp of each logits row (the z loss's)
  Tensor aux_counts;            // [sequences, E] f32: the aux loss's counts (undefined without)
  std::int64_t seq_tokens = 0;  // tokens of a whole sequence (over sp's tp ranks and cp)
};

// The MoE layer's routing part. Forward: logits = x · weightᵀ in f32, then one pass of
// nn::moe_route_forward (route() with the balancing bias when bias_rate > 0, the aux loss's
// per-sequence statistics and the z loss's sum) and the capacity; the statistics summed over the
// ranks holding
// parts of a sequence (tp with sequence parallelism, cp), and this microbatch's aux and z losses
// added to the step's sums (not when recomputing or evaluating: nn::Context::counts_statistics;
// an evaluation, nn::Context::forward_only, skips the aux statistics' all-reduces). Backward: one
// nn::moe_route_backward from d(weights), through the renormalisation and the scores, plus the
// aux-loss and z-loss gradients scaled by ctx.loss_scale() (the aux loss over each whole
// sequence; the z loss over the tokens): the weight's gradient (accumulated) and the router's part
// of d(x).
//
// Statistics: count() adds a microbatch's load (on the device) and its assignments to the step's
// counters;
// take_counters() / finish_step() (MoELayer's, see moe_layer.hpp) end a step: the balancing bias
// moves by the step's load, and an expert idle for idle_warning_steps steps is warned about once
// (log::warn on the stage's first rank, naming the layer and the idle experts).
class Router {
 public:
  // Declares "router.weight" [E, d] through add (dense; replicated over tp, reduce_over_tp with
  // sequence parallelism). tp is required (one rank for none), cp may be null. The config is the
  // owner's to check (MoELayer's constructor).
  Router(const nn::AddParameter& add, Communicator& tp, Communicator* cp, std::int64_t dim,
         const RouterConfig& config, bool sequence_parallel, float init_std);

  const RouterConfig& config() const { return config_; }
  nn::Parameter* weight() const { return weight_; }
  // The balancing bias [E] f32 (zero without bias_rate), the same on every rank.
  const Tensor& balance_bias() const { return bias_; }
  void set_balance_bias(const std::vector<float>& values);

  // x [T, d] of `sequences` sequences (their tokens on this rank) -> the routing of its tokens.
  RouterHandle forward(nn::Context& ctx, const Tensor& x, std::int64_t sequences);
  // d(weights) [T, k] f32 of the forward that filled h -> the router's part of d(x), [T, d] f32;
  // accumulates the weight's gradient.
  Tensor backward(nn::Context& ctx, const RouterHandle& h, const Tensor& dweights);

  // Adds a microbatch to the step's counters: its kept assignments per expert, [E] i64 tensors on
  // the layer's device (moe_permute's counts, one per chunk of tokens: they are summed, on the
  // device, on stream, without a host wait), and its routed assignments (tokens x k, dropped
  // included). After this step's forward.
  void count(const std::vector<Tensor>& loads, std::int64_t assignments, const Stream& stream);
  // counters_size() values, [load (E), assignments, aux sum, z sum, microbatches]; the dropped
  // assignments are the assignments less the load.
  std::int64_t counters_size() const { return config_.experts + 4; }
  // Appends the counters to host with the device's (the load, the aux and z sums) as 0 and
  // returns those, [E + 2] f64 on the layer's device (load, aux sum, z sum; undefined when no
  // forward ran this step), to be put at offsets 0..E and E + 1, E + 2; the next step counts
  // from zero.
  Tensor take_counters(std::vector<double>& host);
  // From the counters summed over stage: the step's statistics; moves the balancing bias and
  // warns about idle experts (on the stage's rank 0).
  MoEStats finish_step(const double* summed, const Communicator& stage, const Stream& stream);

 private:
  Communicator* tp_;
  Communicator* cp_;
  RouterConfig config_;
  bool sequence_parallel_;
  nn::Parameter* weight_;
  Tensor bias_;          // [E] f32 on the CPU: the master copy
  Tensor bias_device_;   // its copy on the GPU the layer runs on (undefined until needed)
  Tensor bias_staging_;  // pinned: the host side of bias_device_'s last upload
  // This step's counters: assignments and microbatches on the host; the load per expert and the
  // sums of the aux and z losses, [E + 2] f64 on the layer's device.
  double assignments_ = 0.0, microbatches_ = 0.0;
  Tensor sums_;
  // Consecutive finished steps in which each expert received no token, and whether the layer has
  // warned about it.
  std::vector<std::int64_t> idle_steps_;
  bool warned_idle_ = false;

  const Tensor& device_bias(const Device& device, const Stream& stream);
  void upload_bias(const Device& device, const Stream& stream);
  void check_idle_experts(const MoEStats& step, const Communicator& stage);
};

}  // namespace quintet::expert
