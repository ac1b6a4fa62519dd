// The experts of an MoE layer (parallel/expert/experts.cpp): this rank's E_l = E / ep expert MLPs,
// GELU (fc, proj) or SwiGLU (fc = gate, up, proj) of width F, without biases, each split over the
// expert-tensor-parallel (etp) group (fc and up by rows, proj by columns: F / etp of the width).
// MoELayer (moe_layer.hpp) composes them with its Router (router.hpp) and its TokenDispatcher
// (token_dispatcher.hpp), which hands them the rows in expert-major order.
//
// forward runs each local expert as one GEMM chain over its consecutive block of rows (experts
// with no rows are skipped) and keeps what backward needs in an ExpertsActivations; backward
// accumulates the weight gradients and returns the rows' gradients (partial sums over etp, which
// the dispatcher's return reduces). Device-generic (the nn ops: CPU f32 / f64, CUDA bf16 / f32).
//
// Parameters (declared by the owning module under its own names, so that checkpoints keep them):
// experts.fc.weight [E_l, F/etp, d], experts.up.weight (SwiGLU), experts.proj.weight
// [E_l, d, F/etp]: expert parameters (is_expert) sharded over ep (dim 0) and, with etp > 1, over
// etp (their width dim), each the exact slice of the [E, F, d] / [E, d, F] draw, so that every
// layout holds the same model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/parameter.hpp"

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

// The weights one pass reads: [E_l, ...] each (up undefined for GELU).
struct ExpertWeights {
  Tensor fc, up, proj;
};

// What a forward over one batch of rows keeps for its backward.
struct ExpertsActivations {
  Tensor rows;                       // [n, d]: the input rows, expert-major
  std::vector<std::int64_t> counts;  // [E_l]: the rows of each local expert, in order
  std::vector<Tensor> fc_out;        // per local expert: rows · fcᵀ (undefined when no rows)
  std::vector<Tensor> up_out;        // per local expert: rows · upᵀ (SwiGLU; else undefined)
};

class Experts {
 public:
  // Declares a parameter on the owning module (nn::Module::add_parameter).
  using AddParameter =
      std::function<nn::Parameter&(const std::string& name, const Shape& shape,
                                   nn::ParameterInit init, nn::ParameterAttributes attrs)>;
  // Declares experts.fc.weight, experts.up.weight (SwiGLU) and experts.proj.weight through add.
  // The config is the owner's to check (MoELayer's constructor).
  Experts(const AddParameter& add, const ExpertsConfig& config);

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
  // [n, d], the experts' outputs in the same order. Fills saved.
  Tensor forward(const ExpertWeights& w, const Tensor& rows, std::vector<std::int64_t> counts,
                 ExpertsActivations& saved, const Stream& stream) const;
  // dy [n, d] of the forward that filled saved -> d(rows) [n, d]; accumulates the weight
  // gradients into grads = {fc, up, proj}'s gradient tensors (up's undefined for GELU).
  Tensor backward(const ExpertWeights& w, const Tensor& dy, const ExpertsActivations& saved,
                  const std::vector<Tensor>& grads, const Stream& stream) const;

 private:
  std::int64_t local_experts_, first_expert_;
  nn::Parameter* fc_;
  nn::Parameter* up_ = nullptr;
  nn::Parameter* proj_;
};

}  // namespace quintet::expert
