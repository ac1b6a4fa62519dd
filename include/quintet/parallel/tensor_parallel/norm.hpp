// Norms on (possibly sequence-split) activations (parallel/tensor_parallel/norm.cpp). Conventions:
// regions.hpp.
#pragma once

#include <cstdint>
#include <memory>

#include "quintet/nn/layer_kinds.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::tensor_parallel {

// ---- norms on (possibly sequence-split) activations ------------------------------------------

struct ParallelNormOptions {
  float eps = 1e-5f;
  bool sequence_parallel = false;  // the parameters' gradients are summed over tp
};

// A norm that can also take the residual add before it (the pre-norm block's h = x + r;
// y = norm(h)), fused on a GPU (nn::layernorm_forward's residual).
class ParallelNorm : public nn::Module {
 public:
  struct SumAndNorm {
    Tensor sum;  // x + residual
    Tensor y;    // norm(x + residual)
  };
  // forward(x + residual), also returning the sum. Its backward is backward_add.
  virtual SumAndNorm forward_add(nn::Context& ctx, const Tensor& x, const Tensor& residual) = 0;
  // backward(dy) + dresidual: the gradient of the sum, with dresidual the gradient reaching the
  // sum from elsewhere (the residual path). After forward or forward_add.
  virtual Tensor backward_add(nn::Context& ctx, const Tensor& dy, const Tensor& dresidual) = 0;
};

// LayerNorm over the last dim (weight, bias [dim], replicated) whose parameters carry
// reduce_over_tp = sequence_parallel.
class ParallelLayerNorm : public ParallelNorm {
 public:
  explicit ParallelLayerNorm(std::int64_t dim, const ParallelNormOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  SumAndNorm forward_add(nn::Context& ctx, const Tensor& x, const Tensor& residual) override;
  Tensor backward_add(nn::Context& ctx, const Tensor& dy, const Tensor& dresidual) override;

 private:
  float eps_;
  nn::Parameter* weight_;
  nn::Parameter* bias_;
};

// RMSNorm over the last dim (weight [dim], replicated), reduce_over_tp = sequence_parallel.
class ParallelRMSNorm : public ParallelNorm {
 public:
  explicit ParallelRMSNorm(std::int64_t dim, const ParallelNormOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  SumAndNorm forward_add(nn::Context& ctx, const Tensor& x, const Tensor& residual) override;
  Tensor backward_add(nn::Context& ctx, const Tensor& dy, const Tensor& dresidual) override;

 private:
  float eps_;
  nn::Parameter* weight_;
};

// A ParallelLayerNorm or ParallelRMSNorm (the final norm of a model, for instance).
std::unique_ptr<ParallelNorm> make_parallel_norm(nn::NormKind kind, std::int64_t dim,
                                                 const ParallelNormOptions& options = {});

}  // namespace quintet::tensor_parallel
