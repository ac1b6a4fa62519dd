// Norms on (possibly sequence-split) activations (parallel/tensor/norm.cpp). Conventions:
// regions.hpp.
#pragma once

#include <cstdint>
#include <memory>

#include "quintet/nn/layers.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet {

// ---- norms on (possibly sequence-split) activations ------------------------------------------

struct ParallelNormOptions {
  float eps = 1e-5f;
  bool sequence_parallel = false;  // the parameters' gradients are summed over tp
};

// nn::LayerNorm over the last dim (weight, bias [dim], replicated) whose parameters carry
// reduce_over_tp = sequence_parallel.
class ParallelLayerNorm : public nn::Module {
 public:
  explicit ParallelLayerNorm(std::int64_t dim, const ParallelNormOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  nn::Parameter* weight_;
  nn::Parameter* bias_;
};

// nn::RMSNorm over the last dim (weight [dim], replicated), reduce_over_tp = sequence_parallel.
class ParallelRMSNorm : public nn::Module {
 public:
  explicit ParallelRMSNorm(std::int64_t dim, const ParallelNormOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  float eps_;
  nn::Parameter* weight_;
};

// A ParallelLayerNorm or ParallelRMSNorm (the final norm of a model, for instance).
std::unique_ptr<nn::Module> make_parallel_norm(nn::NormKind kind, std::int64_t dim,
                                               const ParallelNormOptions& options = {});

}  // namespace quintet
