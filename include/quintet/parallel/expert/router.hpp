// The router of a mixture-of-experts layer (parallel/expert/router.cpp): which experts each token
// goes to, with which combine weights, and the load-balancing terms. Pure functions on f32 tensors
// (T tokens, E experts, k experts per token); the MoE layer (moe_layer.hpp) calls them.
// Device-generic: CPU tensors are computed in place, CUDA tensors by kernels queued on `stream`
// (parallel/expert/cuda/moe_kernels.cu) without a host synchronisation, except where a function
// returns a host value (expert_load, aux_loss, z_loss: those wait).
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
//   z loss    z_loss_coeff * mean_t logsumexp(logits_t)^2 (ST-MoE).
//   bias      after each step, bias_e += bias_rate * sign(mean load - load_e), with the load
//             counted over the whole step (update_balance_bias).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::expert {

enum class RouterScore { softmax, sigmoid };
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

// Assignments per expert that were kept: [E] counts of routing (sum = T * k - dropped).
std::vector<std::int64_t> expert_load(const Routing& routing, std::int64_t experts,
                                      const Stream& stream = Stream());

// d(probs) [T, E] from d(weights) [T, k] (dropped assignments carry no gradient), through the
// renormalisation when config.renormalize.
Tensor weights_backward(const Routing& routing, const Tensor& dweights, const RouterConfig& config,
                        const Stream& stream = Stream());
// d(logits) [T, E] from d(probs) [T, E] through the softmax or sigmoid.
Tensor scores_backward(const Tensor& probs, const Tensor& dprobs, RouterScore score,
                       const Stream& stream = Stream());

// The aux loss's statistics of `groups` equal groups of consecutive tokens (T divisible by
// groups): selected-assignment counts and sums of probs per group and expert, [groups, E] f32
// each. They add up over ranks holding parts of the same groups (all-reduce them, sum, before
// aux_loss).
struct AuxStats {
  Tensor counts;    // [G, E] f32
  Tensor prob_sum;  // [G, E] f32
};
AuxStats aux_stats(const Routing& routing, std::int64_t groups, const Stream& stream = Stream());
// aux_loss_coeff * mean_g L_g of whole-group statistics, with n tokens per group.
double aux_loss(const AuxStats& stats, std::int64_t group_tokens, const RouterConfig& config);
// The same added into acc, a [1] f64 tensor on the statistics' device (no host wait).
void accumulate_aux_loss(const AuxStats& stats, std::int64_t group_tokens,
                         const RouterConfig& config, const Tensor& acc,
                         const Stream& stream = Stream());
// Adds scale * d(aux loss)/d(probs) into dprobs [T, E] for this rank's tokens (its T tokens are in
// groups of T / G consecutive tokens, G = stats' rows), from whole-group statistics.
void add_aux_loss_grad(const AuxStats& stats, std::int64_t group_tokens, const RouterConfig& config,
                       float scale, const Tensor& dprobs, const Stream& stream = Stream());

// z_loss_coeff * mean over the T rows of logsumexp(logits)^2 (0 for T = 0).
double z_loss(const Tensor& logits, const RouterConfig& config);
// The same added into acc, a [1] f64 tensor on the logits' device (no host wait).
void accumulate_z_loss(const Tensor& logits, const RouterConfig& config, const Tensor& acc,
                       const Stream& stream = Stream());
// Adds scale * z_loss_coeff * 2 * lse_t * softmax(logits_t) into dlogits (the gradient of
// scale * z_loss_coeff * sum_t lse_t^2: divide scale by the token count for the mean).
void add_z_loss_grad(const Tensor& logits, const RouterConfig& config, float scale,
                     const Tensor& dlogits, const Stream& stream = Stream());

// One step of auxiliary-loss-free balancing: bias_e += rate * sign(mean(load) - load_e), with
// load the kept assignments per expert over the step (summed over every rank). bias [E] f32 CPU.
void update_balance_bias(const Tensor& bias, const std::vector<double>& load, float rate);

}  // namespace quintet::expert
