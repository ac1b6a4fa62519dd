// The fp8 mode of 09_op_bench: where an FP8 linear layer's time goes against the bf16 one, at
// the linear shapes of the Llama-style block, on one GPU, in one run (issue 45).
//
// The layers are the trainer's (parallel/tensor_parallel/attention.cpp and mlp.cpp, tp 1): the
// query projection d -> H·D, the fused key/value projection d -> 2·KV·D, the output projection
// H·D -> d, SwiGLU's gate and up projections d -> F (two layers, not fused) and the down
// projection F -> d, on `tokens` rows (micro-batch x sequence), bf16 in and out, no bias, the
// weight gradient accumulated into f32. Each product (forward, dgrad, wgrad) is timed in FP8
// (nn::fp8_gemm, called as parallel/tensor_parallel/linear.cpp calls it: forward with fast
// accumulation into bf16, dgrad into bf16, wgrad accumulated into the f32 gradient) and in bf16
// (nn::linear_forward, linear_backward_input, linear_backward_weight: the bf16 layer's calls),
// FLOPs = 2·tokens·in·out. The FP8 layer's casts are timed as the layer makes them, through a
// tensor_parallel::Fp8Linear over a one-rank communicator: forward, the scales of x and w
// (Fp8Linear::forward_scales: under current scaling one amax launch over both and one scale
// launch for both) and the casts of x and w with their transposes (nn::fp8_casts: one launch for
// both, "cast_xw"); dgrad, dy's scale (Fp8Linear::output_grad_scale) and its cast with the
// transpose (nn::fp8_cast); wgrad none (it reads the transposes). A cast's GB/s counts the least it
// moves (bf16 read, its FP8 data and transpose written; the scales: the tensors read), against a
// device-to-device copy measured in the same run. A layer's line sums its three GEMMs and its
// casts: whether the casts eat the GEMMs' gain. Two layers reading one x (attn.kv and attn.q,
// mlp.gate and mlp.up) have their forward casts timed both ways, each layer's own and x cast once
// for both as the trainer does (ColumnParallelLinear::forward_shared_input: x and both weights in
// one launch); "block x once" is the block with that saving. Times are medians of `iters` calls
// after warm-up.
#pragma once

#include <cstdint>

#include "quintet/core/stream.hpp"
#include "quintet/nn/fp8.hpp"

struct Fp8BenchOptions {
  bool json = false;
  int iters = 20;
  std::int64_t tokens = 8192;  // micro-batch 4 x sequence 2048
  std::int64_t hidden = 2048;  // d
  std::int64_t heads = 32;     // H
  std::int64_t kv_heads = 8;   // KV
  std::int64_t head_dim = 64;  // D
  std::int64_t ffn = 8192;     // F
  quintet::nn::Fp8Scaling scaling = quintet::nn::Fp8Scaling::current;  // the trainer's default
  std::int64_t copy_bytes = 1LL << 30;                                 // the copy bound's buffer
};

// Throws std::invalid_argument naming the option unless every size is positive.
void check_fp8_options(const Fp8BenchOptions& opt);

// Measures and prints (text tables or one JSON object per line) the copy bound, each layer's
// products with their casts, each layer's sum and the block's, on stream s (its device current).
void bench_fp8(const Fp8BenchOptions& opt, const quintet::Stream& s);
