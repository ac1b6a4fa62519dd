// Column- and row-parallel linear layers (parallel/tensor_parallel/linear.cpp). Conventions:
// regions.hpp.
#pragma once

#include <cstdint>
#include <utility>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/module.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/tensor_parallel/fp8.hpp"

namespace quintet::tensor_parallel {

// How a column-parallel layer is built (designated initializers read at the call site:
// ColumnParallelLinear(tp, 64, 256, {.bias = false, .sequence_parallel = true})).
struct ColumnParallelOptions {
  bool bias = true;
  float init_std = 0.02f;          // normal(0, init_std) weight
  bool sequence_parallel = false;  // x is [B, S/tp, in], gathered on entry
  std::int64_t fused_parts = 1;    // equal blocks of out split separately (a fused QKV: 3)
  bool enter_region = true;        // false: x is already in the region (the caller reduces dx)
  // > 1: out (each fused part) is split into tp / replicas blocks, and rank r holds block
  // r / replicas, shared by `replicas` consecutive tp ranks (key/value heads replicated when
  // kv_heads < tp). Needs enter_region = false: the caller sums the replicas' output gradients
  // (so each holds the whole weight gradient) and counts their dx once.
  int replicas = 1;
  // > 1: the layer's communication is cut into this many chunks along the sequence, each
  // overlapping another chunk's GEMM (with SP the all-gather forward, and dx's all-reduce or
  // reduce-scatter backward); the sequence (seq/tp with SP) must be a multiple. See below.
  int overlap_chunks = 1;
  // mode hybrid: the GEMMs in FP8 (emulated on the CPU), with scaling state "fp8_x", "fp8_w"
  // and "fp8_dy" (fp8.hpp).
  nn::Fp8Recipe fp8{};
};

// A column-parallel layer over a borrowed weight (a tied LM head).
struct SharedWeightOptions {
  bool sequence_parallel = false;
  nn::GradReady ready = nn::GradReady::defer;  // who marks the weight's gradient ready (below)
  nn::Fp8Recipe fp8{};  // as ColumnParallelOptions::fp8 (a tied LM head with --fp8-lm-head)
};

struct RowParallelOptions {
  bool bias = true;
  float init_std = 0.02f;
  bool sequence_parallel = false;  // the output is reduce-scattered to [B, S/tp, out]
  // > 1: the output's all-reduce (with SP reduce-scatter) and, with SP, dy's all-gather backward
  // are cut into this many chunks along the sequence, overlapping the GEMMs. See below.
  int overlap_chunks = 1;
  nn::Fp8Recipe fp8{};  // as ColumnParallelOptions::fp8
};

// Overlap chunks (overlap_chunks = k > 1, tp > 1): chunk j is positions [j*L/k, (j+1)*L/k) of
// every rank's part (L = S/tp with SP; without SP the rows of [B*S] in k equal blocks). Forward,
// the column-parallel layer's SP all-gather of chunk j + 1 runs while chunk j's GEMM does (all k
// gathers are issued at once; the GEMM of chunk 0 starts after one chunk has arrived, not the
// whole sequence), and the row-parallel layer's all-reduce or reduce-scatter of chunk j runs while
// chunk j + 1's GEMM does. Backward mirrors it: the column-parallel dx is reduced in chunks under
// the later chunks' dx GEMMs and the weight gradient; the row-parallel SP dy is gathered in chunks
// under the dx GEMMs (the gathered input of the weight gradient is kept from forward, not
// gathered again). Each GEMM row's arithmetic is the same as unchunked; what may differ is the
// summation order of a reduction whose algorithm depends on the message size (tests say where).
// What cannot be hidden: the last chunk's reduction in forward (the norm after the row-parallel
// layer reads its sum) and the first chunk's gather. Chunk counts that do not divide are refused
// in forward before any communication, as an InvalidArgument naming the layer and the sizes.

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
  // {a.forward(ctx, x), b.forward(ctx, x)} of two layers that read the same x (attention's
  // key/value and query, SwiGLU's gate and up), bit for bit. Where both run their GEMMs in FP8 on
  // the GPU with enter_region = false and no overlap chunks, and scale x alike
  // (Fp8Linear::same_x_scale), x is cast once for both (one amax pass over it, one cast with its
  // transpose, which both backward passes read); otherwise the two forwards as they are.
  static std::pair<Tensor, Tensor> forward_shared_input(nn::Context& ctx, ColumnParallelLinear& a,
                                                        ColumnParallelLinear& b, const Tensor& x);
  std::int64_t local_out() const { return local_out_; }
  int overlap_chunks() const { return chunks_; }
  nn::Parameter& weight() { return *weight_; }
  nn::Parameter* bias() { return bias_; }

 private:
  bool chunked_here() const { return chunks_ > 1 && tp_->size() > 1; }
  // Throws InvalidArgument unless x is [..., in].
  void check_input(const Tensor& x) const;
  // With recipe.mode hybrid, declares "fp8_x", "fp8_w" and "fp8_dy" and turns fp8_ on.
  void declare_fp8(const nn::Fp8Recipe& recipe);
  Communicator* tp_;
  std::int64_t in_, local_out_;
  bool sp_, enter_region_;
  int chunks_ = 1;
  nn::GradReady ready_ = nn::GradReady::mark;  // defer: a borrowed weight its owner marks
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
  Fp8Linear fp8_;
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
  bool chunked_here() const { return chunks_ > 1 && tp_->size() > 1; }
  Communicator* tp_;
  std::int64_t local_in_, out_;
  bool sp_;
  int chunks_ = 1;
  nn::Parameter* weight_;
  nn::Parameter* bias_ = nullptr;
  Fp8Linear fp8_;
};

}  // namespace quintet::tensor_parallel
