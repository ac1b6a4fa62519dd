// The experts of an MoE layer (parallel/expert/experts.cpp): this rank's E_l = E / ep expert MLPs,
// GELU (fc, proj) or SwiGLU (fc = gate, up, proj) of width F, without biases, each split over the
// expert-tensor-parallel (etp) group (fc and up by rows, proj by columns: F / etp of the width).
// MoELayer (moe_layer.hpp) composes them with its Router (router.hpp) and its TokenDispatcher
// (token_dispatcher.hpp), which hands them the rows in expert-major order.
//
// forward runs each projection of every local expert as one grouped linear op
// (quintet/nn/grouped_linear.hpp) over the consecutive blocks of rows, the activation over all the
// rows at once, and keeps what backward needs in an ExpertsActivations; backward accumulates the
// weight gradients and returns the rows' gradients (partial sums over etp, which the dispatcher's
// return reduces). Device-generic (the nn ops: CPU f32 / f64, CUDA bf16 / f32). The row ranges
// come as host counts (forward's first form) or as offsets on the device only (its second form,
// which needs no host synchronisation).
//
// Parameters (declared by the owning module under its own names, so that checkpoints keep them):
// experts.fc.weight [E_l, F/etp, d], experts.up.weight (SwiGLU), experts.proj.weight
// [E_l, d, F/etp]: expert parameters (is_expert) sharded over ep (dim 0) and, with etp > 1, over
// etp (their width dim), each the exact slice of the [E, F, d] / [E, d, F] draw, so that every
// layout holds the same model.
//
// FP8 (ExpertsFp8, the "hybrid" recipe of the tp linear layers, parallel/tensor_parallel/fp8.hpp):
// fc, up and proj run on nn::fp8_cast's operands through the grouped FP8 ops
// (quintet/nn/grouped_linear.hpp: fp8_gemm's products over every expert at once; the exact
// emulation on the CPU, bit for bit a per-expert loop of nn::fp8_gemm): forward q(x) · q(W)ᵀ
// with x and W in E4M3, dgrad q(dy) · q(W) with dy in E5M2, wgrad q(dy)ᵀ · q(x) accumulated in
// f32. Each operand is cast once as a whole (the rows [n, d] of every expert, the weights
// [E_l, ...] of every expert), its transpose with it; a group's operand is a slice of it. So the
// FP8 experts take the offsets on the device like the others and need no host counts. The
// scales are PER TENSOR, from Fp8Linear's device-scale calls
// (forward_scales, output_grad_scale): one for each operand over every local expert and every
// row of the call (the rows [n, d] of all experts, the weights [E_l, ...] of all experts, the
// hidden h [n, F/etp], the gradients), the amaxes reduced (max) over `stage` (the ranks of the
// pipeline stage), so every expert of every rank uses the same scale for a role. That is what a
// grouped GEMM takes (one scale per operand for all its groups, no per-group scale pointers) and
// needs no bookkeeping by expert: the histories are the same on every rank, so delayed
// scaling's step end (fp8_end_step over the stage) and checkpoints (saved once, by name, loaded
// at any ep) are the tp layers'. Reduced over the whole stage, an amax is that of the tokens
// every data-parallel replica routes in the same microbatch slot: a layout gives one rank's
// scales when dp = 1 (tp, sp, ep within tp, etp), and any two layouts of the same dp give each
// other's (ep spreading over replicas or not). Scales are per call, so per exchange chunk with
// overlap_chunks > 1 (ep > 1): compare layouts with one chunk. fc and up share x's scale, as one
// fused GEMM's input would.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"

namespace quintet::expert {

struct ExpertsConfig {
  std::int64_t experts = 1;  // E, over every ep rank
  std::int64_t dim = 0;      // d
  std::int64_t ffn = 0;      // each expert's width F, over every etp rank
  nn::Activation activation = nn::Activation::gelu;
  float init_std = 0.02f;       // fc, up
  float proj_init_std = 0.02f;  // proj
  int ep = 1, ep_rank = 0;      // E % ep == 0
  int etp = 1, etp_rank = 0;    // F % etp == 0
};

// The FP8 emulation of the experts' GEMMs (off: default-constructed). up is off for GELU; up shares
// fc's x scale. The scales are declared by the owning module (MoELayer).
struct ExpertsFp8 {
  tensor_parallel::Fp8Linear fc, up, proj;
  Communicator* stage = nullptr;  // the amaxes are reduced over it; required when fc.on()
};

// The weights one pass reads: [E_l, ...] each (up undefined for GELU).
struct ExpertWeights {
  Tensor fc, up, proj;
};

// What a forward over one batch of rows keeps for its backward.
struct ExpertsActivations {
  Tensor rows;     // [n, d]: the input rows, expert-major
  Tensor offsets;  // [E_l + 1] i64 on the rows' device: local expert le has rows [o_le, o_le+1)
  // The same offsets on the host when forward had the counts, else empty.
  std::vector<std::int64_t> host_offsets;
  Tensor offsets_staging;  // pinned host copy the offsets were uploaded from (GPU): kept alive
  Tensor fc_out;           // [n, F/etp]: each row · its expert's fcᵀ
  Tensor up_out;           // [n, F/etp]: each row · its expert's upᵀ (SwiGLU; else undefined)
  // FP8 only: the whole-tensor casts that backward's grouped GEMMs read, their transposes only
  // (data undefined): of the rows, fc, up (SwiGLU), proj's input and proj.
  struct Fp8Saved {
    nn::Fp8Tensor x_t, fc_t, up_t, h_t, proj_t;
  };
  Fp8Saved fp8;
};

class Experts {
 public:
  // Declares a parameter on the owning module (nn::Module::add_parameter).
  using AddParameter =
      std::function<nn::Parameter&(const std::string& name, const Shape& shape,
                                   nn::ParameterInit init, nn::ParameterAttributes attrs)>;
  // Declares experts.fc.weight, experts.up.weight (SwiGLU) and experts.proj.weight through add.
  // The config is the owner's to check (MoELayer's constructor). fp8: the GEMMs in FP8 (above).
  Experts(const AddParameter& add, const ExpertsConfig& config, ExpertsFp8 fp8 = {});

  std::int64_t local_experts() const { return local_experts_; }
  std::int64_t first_expert() const { return first_expert_; }
  nn::Parameter* fc() const { return fc_; }
  nn::Parameter* up() const { return up_; }  // null for GELU
  nn::Parameter* proj() const { return proj_; }

  // The weights for a forward on stream (Parameter::use: waits for their refresh) and for a
  // backward (their values: the forward already waited).
  ExpertWeights use(const Stream& stream) const;
  ExpertWeights data() const;

  // rows [n, d] in expert-major order, counts[le] of them for local expert le (sum = n) ->
  // [n, d], the experts' outputs in the same order. Fills saved. record: the FP8 amaxes count
  // for the step (nn::Context::counts_statistics). With FP8, collective over fp8.stage (every
  // rank calls it, with rows or not).
  Tensor forward(const ExpertWeights& w, const Tensor& rows, std::vector<std::int64_t> counts,
                 ExpertsActivations& saved, bool record, const Stream& stream);
  // The same with the row ranges on the device only: offsets [E_l + 1] i64 on the rows' device
  // (0 = o_0 <= o_1 <= ... <= o_E_l <= n; expert le has rows [o_le, o_le+1)), e.g. the running
  // sums of the token permutation's counts (the ep = 1 path). Rows past o_E_l are padding: zero
  // outputs, zero gradients; they must be zero (moe_permute's are), since FP8's amaxes run over
  // every row. On a GPU, bf16 and FP8 alike read the offsets on the host (one wait) and run the
  // per-expert cuBLASLt loop, the fastest measured (nn::grouped_gemm_wants_host_offsets); with
  // QUINTET_GROUPED_GEMM=kernel or wgmma the GEMMs are the grouped kernels, which read the offsets
  // on the device (grouped_linear.hpp): no host synchronisation.
  Tensor forward(const ExpertWeights& w, const Tensor& rows, const Tensor& offsets,
                 ExpertsActivations& saved, bool record, const Stream& stream);
  // dy [n, d] of the forward that filled saved -> d(rows) [n, d]; accumulates the weight
  // gradients into grads = {fc, up, proj}'s gradient tensors (up's undefined for GELU), or
  // overwrites grads[i] where overwrite[i] (a stale gradient's first contribution of the step,
  // nn::Parameter::grad_for_write: every local expert's block written, one without rows zeroed).
  Tensor backward(const ExpertWeights& w, const Tensor& dy, const ExpertsActivations& saved,
                  const std::vector<Tensor>& grads, const std::vector<bool>& overwrite,
                  const Stream& stream);

 private:
  std::int64_t local_experts_, first_expert_;
  nn::Parameter* fc_;
  nn::Parameter* up_ = nullptr;
  // The forward of both forms (host_offsets empty when unknown), without FP8.
  Tensor forward_grouped(const ExpertWeights& w, const Tensor& rows, ExpertsActivations& saved,
                         const Stream& stream);
  // The FP8 path of forward and backward (fp8_ on).
  Tensor forward_fp8(const ExpertWeights& w, const Tensor& rows, ExpertsActivations& saved,
                     bool record, const Stream& stream);
  Tensor backward_fp8(const Tensor& dy, const ExpertsActivations& saved,
                      const std::vector<Tensor>& grads, const std::vector<bool>& overwrite,
                      const Stream& stream);

  nn::Parameter* proj_;
  ExpertsFp8 fp8_;
};

}  // namespace quintet::expert
