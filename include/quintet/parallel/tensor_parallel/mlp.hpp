// The tensor-parallel MLP (parallel/tensor_parallel/mlp.cpp): a transformer block's MLP split along
// its hidden size over tp. Conventions (activations, streams, parameters): regions.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/parallel/tensor_parallel/linear.hpp"

namespace quintet::tensor_parallel {

struct ParallelMLPOptions {
  nn::Activation activation = nn::Activation::gelu;
  float init_std = 0.02f;          // fc (and up)
  float proj_init_std = 0.02f;     // proj
  bool sequence_parallel = false;  // x and the output are [B, S/tp, dim]
  // The tp communication in chunks under the GEMMs (linear.hpp): fc's and proj's. SwiGLU's gate
  // and up share one entry into the region, done here unchunked; its proj is chunked.
  int overlap_chunks = 1;
  nn::Fp8Recipe fp8{};  // mode hybrid: fc, up and proj in FP8 (linear.hpp)
};

// An MLP split along hidden: GELU: fc (column) -> gelu -> proj (row), with biases. SwiGLU: gate
// "fc" and "up" (column, no bias, sharing one entry into the tp region) -> silu(gate) * up ->
// proj (row, no bias). x [B, S(/tp), dim] -> same shape.
class ParallelMLP : public nn::Module {
 public:
  ParallelMLP(Communicator& tp, std::int64_t dim, std::int64_t hidden,
              const ParallelMLPOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  Communicator* tp_;
  nn::Activation activation_;
  bool sp_;
  ColumnParallelLinear* fc_;
  ColumnParallelLinear* up_ = nullptr;
  RowParallelLinear* proj_;
};

}  // namespace quintet::tensor_parallel
