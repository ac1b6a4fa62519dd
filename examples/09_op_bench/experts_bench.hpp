// The experts mode of 09_op_bench: the expert GEMMs of a mixture-of-experts layer, a loop of our
// per-expert linear ops (the per-group cuBLASLt path of nn::grouped_linear_*, what
// parallel/expert/experts.cpp runs with host counts) against one cublasGemmGroupedBatchedEx per
// product (grouped_gemm.hpp) and against our grouped kernels (nn::grouped_linear_* with the
// offsets on the device only: one launch per product; the mma.sync kernel, and on an sm_90 GPU
// the wgmma one, QUINTET_GROUPED_GEMM=wgmma), on one GPU, in the same run.
//
// The layer: E experts, expert e on rows_e rows (contiguous blocks of one [sum rows, d] tensor),
// fc w1 [E, F, d] and proj w2 [E, d, F], no bias, bf16 with f32 accumulation. The products, each
// over all experts: forward fc (x·w1ᵀ) and proj (h·w2ᵀ), backward input (dy·w) and backward
// weight (dw += dyᵀ·x, dw f32) of both. FLOPs = 2·rows·N·K summed over the experts.
//
// Then the same six products in FP8 (x and w E4M3, dy E5M2, each cast whole at one scale, bf16
// out, dw f32): a loop of nn::fp8_gemm per expert (cuBLASLt's FP8 matmul; each expert's transposes
// made contiguous beforehand, as per-expert casts give them) against the grouped FP8 ops
// (nn::grouped_fp8_linear_*, offsets on the device, one launch each), beside the bf16 kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/stream.hpp"

struct ExpertBenchOptions {
  bool json = false;
  int iters = 20;              // timed iterations; the median is reported
  int experts = 8;             // E
  std::int64_t hidden = 1024;  // d
  std::int64_t ffn = 2816;     // F
  // Rows per expert; empty: tokens·top_k split over the experts by skew.
  std::vector<std::int64_t> rows;
  std::int64_t tokens = 16384;
  int top_k = 2;
  // 0: even. s > 0: expert e's share ∝ max(0, 1 + s·(2e − (E−1))/(E−1)), the total unchanged;
  // s = (E−1)/(E+1) gives rows ∝ e + 1, s = 1 rows ∝ e (expert 0 empty), s > 1 more empty ones.
  double skew = 0.0;
  std::string grouping = "shape";  // "shape": one cuBLAS group per distinct shape; "expert"
};

// The rows per expert opt describes (opt.rows itself when given). Throws std::invalid_argument
// for a negative count or an empty total.
std::vector<std::int64_t> expert_rows(const ExpertBenchOptions& opt);

// Measures and prints (text table or one JSON object per line) every product and their sum, on
// stream s (its device current). Throws std::runtime_error when the grouped result differs from
// the loop's (max |diff| / max |loop| above 1e-2 for bf16 results, 1e-3 for an f32 dw).
void bench_experts(const ExpertBenchOptions& opt, const quintet::Stream& s);
