// Column- and row-parallel linear layers (parallel/tensor/linear.cpp). Conventions: regions.hpp.
#pragma once

#include <cstdint>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet {

// How a column-parallel layer is built (designated initializers read at the call site:
// ColumnParallelLinear(tp, 64, 256, {.bias = false, .sequence_parallel = true})).
struct ColumnParallelOptions {
  bool bias = true;
  float init_std = 0.02f;          // normal(0, init_std) weight
  bool sequence_parallel = false;  // x is [B, S/tp, in], gathered on entry
  std::int64_t fused_parts = 1;    // equal blocks of out split separately (a fused QKV: 3)
  bool enter_region = true;        // false: x is already in the region (the caller reduces dx)
};

// A column-parallel layer over a borrowed weight (a tied LM head).
struct SharedWeightOptions {
  bool sequence_parallel = false;
  nn::GradReady ready = nn::GradReady::defer;  // who marks the weight's gradient ready (below)
};

struct RowParallelOptions {
  bool bias = true;
  float init_std = 0.02f;
  bool sequence_parallel = false;  // the output is reduce-scattered to [B, S/tp, out]
};

// ---- linear layers --------------------------------------------------------------------------

// y = x · Wᵀ + b with W [out, in] split along out: rank r holds output features
// [r*out/tp, (r+1)*out/tp). x enters the tp region (identity forward / all-reduce of dx backward;
// with SP all-gather of the sequence forward / reduce-scatter of dx backward). Output
// [B, S, out/tp], the full sequence, not gathered over features.
// fused_parts > 1 splits each of that many equal blocks of out separately (a fused QKV: parts =
// 3, so rank r holds rows r of q, of k and of v); the weight is then declared
// [parts, out/parts/tp, in] (bias [parts, out/parts/tp]), the exact slice of the unsharded
// [parts, out/parts, in] draw. enter_region = false: x is already inside the region (the full
// sequence on every rank) and the caller reduces dx itself (for layers sharing one input).
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out,
                       const ColumnParallelOptions& options = {});
  // A column-parallel layer without bias that borrows another layer's weight, a [out/tp, in]
  // shard split along out (a tied LM head reusing VocabParallelEmbedding::weight(): the same rows
  // of the same table). The weight is not a parameter of this module; backward accumulates its
  // gradient and, with ready = defer, leaves it for the owner's backward, which must run later in
  // the same microbatch, to mark ready; with ready = mark (an owner that never runs backward, as a
  // last pipeline stage's copy of the table) marks it itself.
  ColumnParallelLinear(Communicator& tp, nn::Parameter& shared_weight,
                       const SharedWeightOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  std::int64_t local_out() const { return local_out_; }
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* bias() { return bias_; }

 private:
  Communicator* tp_;
  std::int64_t in_, local_out_;
  bool sp_, enter_region_;
  nn::GradReady ready_ = nn::GradReady::mark;  // defer: a borrowed weight its owner marks
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
};

// y = x · Wᵀ + b with W [out, in] split along in: rank r holds input features
// [r*in/tp, (r+1)*in/tp) and takes x [B, S, in/tp] (a column-parallel layer's output). The
// partial products are all-reduced (with SP reduce-scattered along the sequence: output
// [B, S/tp, out]). The bias [out] is replicated (added once, by tp rank 0, before the reduction);
// its gradient comes from the full-sequence dy, so it needs no tp reduction.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(Communicator& tp, std::int64_t in, std::int64_t out,
                    const RowParallelOptions& options = {});
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* bias() { return bias_; }

 private:
  Communicator* tp_;
  std::int64_t local_in_, out_;
  bool sp_;
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
};

}  // namespace quintet
