// Grouped linear ops: the projections of an MoE layer's local experts in one call each. The rows
// of x are in group order (expert-major), group g holding rows [o_g, o_{g+1}) of the offsets
// o = offsets, and each group has its own weight w_g. The row ranges are read from a tensor on
// x's device, so a caller whose counts are still on the device (the token permutation's) needs no
// host synchronisation to run its experts.
//
// Conventions as in ops.hpp (dtypes, devices, accumulated weight gradients, fresh input
// gradients, checks before any work, `stream`). Offsets: [G + 1] i64 on x's device with
// o_0 = 0 <= o_1 <= ... <= o_G <= n; a group may be empty. Rows at or past o_G (padding) give
// zero outputs and zero input gradients and add nothing to the weight gradients. The values are
// checked on the CPU; on a GPU they cannot be without a host wait, and offsets breaking the rules
// there give unspecified results (never a write outside the outputs).
//
// host_offsets: the same G + 1 offsets on the host when the caller has them (its counts were
// copied back anyway), else empty. Checked against the rules above (on the CPU, also against
// offsets). It picks the implementation on a GPU, below.
//
// Implementations. CPU (f32, f64): per group, the CPU linear op's kernels on the group's rows,
// bit for bit what a loop of nn::linear_* per group gives. GPU: one of three paths, per call (see
// grouped_gemm_path):
//   - per_group: the loop of per-group cuBLASLt GEMMs of nn::linear_* (the proven path; it needs
//     the offsets on the host);
//   - grouped_kernel: one launch per op over every group, reading the offsets on the device
//     (lib/nn/cuda/grouped_gemm.cu, a persistent tile scheduler): bf16 on tensor cores (mma.sync
//     fed by a cp.async pipeline) when in and out are multiples of 8, else (and for f32) a SIMT
//     kernel; f32 accumulation, the weight gradient accumulated in f32;
//   - grouped_wgmma: the same, with a Hopper kernel for the bf16 shapes the tensor cores take
//     (lib/nn/cuda/grouped_gemm_sm90a.cu: wgmma from 128-byte swizzled shared memory, built for
//     sm_90a), and for the FP8 ops' (below); other shapes and f32 fall back to grouped_kernel's
//     kernels. It throws InvalidArgument on a GPU that is not sm_90. Opt-in until its test and
//     benchmark have run.
// A call with host offsets takes per_group unless the environment variable QUINTET_GROUPED_GEMM
// is "kernel" (or "wgmma"); a call without host offsets takes the kernel (grouped_wgmma when
// QUINTET_GROUPED_GEMM is "wgmma"). The per-group loop is the default because it is the fastest
// on the GPU measured: on an H200 (2026-12-05) the GPT-2-style MoE step of
// scripts/bench/moe_benchmarks.sh took 77.7 ms with the loop (its host wait per layer included),
// 100.2 ms with grouped_wgmma and 114.8 ms with grouped_kernel (docs/PERFORMANCE.md). The
// variable is read at each call: a switch for the benchmarks, not a RuntimeConfig setting.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/fp8.hpp"

namespace quintet::nn {

// y_g = x_g · w_gᵀ. x [n, in] (T), w [G, out, in] (T). Returns y [n, out] (T).
Tensor grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                              std::span<const std::int64_t> host_offsets, const Stream& stream);
// dx_g = dy_g · w_g. dy [n, out] (T), w [G, out, in] (T). Returns dx [n, in] (T).
Tensor grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                     std::span<const std::int64_t> host_offsets,
                                     const Stream& stream);
// dw_g += dy_gᵀ · x_g, accumulated in f32 (f64 for f64). dy [n, out], x [n, in] (T), dw
// [G, out, in] accum_dtype(T), contiguous. An empty group leaves dw_g as it was.
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, std::span<const std::int64_t> host_offsets,
                                    const Stream& stream);
// The same with accumulate = false: dw_g = dy_gᵀ · x_g OVERWRITTEN for every group (an empty
// one's dw_g zeroed), bit for bit what accumulating into zeros gives (but for the sign of a zero
// sum): a stale gradient's first contribution of the step (lazy zeroing,
// quintet/nn/parameter.hpp). The CPU and the per_group loop write dw without reading it (each
// group's GEMM with beta 0, a fill per empty group); the grouped kernels accumulate in their
// epilogue, so there dw is zero-filled first and accumulated into, as with accumulate = true.
void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, std::span<const std::int64_t> host_offsets,
                                    bool accumulate, const Stream& stream);

// ---- FP8: the three products of FP8 experts (fp8.hpp's fp8_gemm, grouped) ----------------------
// The operands are whole-tensor nn::fp8_cast results: ONE scale over every group's rows (and
// over every group's weights), so a group's operand is a range of one FP8 tensor: of x, dy
// ([n, *] data) its rows [o_g, o_{g+1}); of their transposes ([*, n]) the same range of
// columns; of the weights' cast (w viewed as [G out, in]) data [G, out, in] the block w_g, and
// of its transpose [in, G out] the columns [g out, (g + 1) out). The products are fp8_gemm's,
// summed in f32 and multiplied by the two inverse scales (scale[0] of each operand). Formats:
// any two but not both E5M2 (the experts: x and w E4M3, dy E5M2). Offsets, host_offsets and
// padding rows as the ops above; the three checks of fp8_gemm (u8 operands, contiguous, scale
// tensors f32 [2] on the device).
//
// Implementations. CPU: per group, the FP8 GEMM's exact emulation (both operands dequantised to
// f32, multiplied in f32) on the group's slices, bit for bit a loop of nn::fp8_gemm over
// per-group casts (elementwise casts at one scale give the same bits sliced or whole). GPU, as
// grouped_gemm_path says: per_group: a loop of nn::fp8_gemm (cuBLASLt's FP8 matmul) over the
// groups, the column ranges of the transposes copied contiguous first; grouped_kernel: one
// launch (lib/nn/cuda/grouped_gemm.cu) over every group: the FP8 mma.sync m16n8k32 (sm_89 and
// later) where in, out and (wgrad) n are multiples of 16, else a SIMT kernel decoding the bytes;
// f32 accumulation, the inverse scales applied in the epilogue. fast_accum only affects cuBLASLt
// (the kernel always accumulates in f32). On Hopper (sm_90) the FP8 mma.sync is not native: ptxas
// converts the operands to f16 and runs f16 tensor cores (NVIDIA/cutlass#1986), so the kernel
// computes at the bf16 kernel's rate at best, with half its operand bytes; Hopper's FP8 rate
// needs wgmma (what cuBLASLt's FP8 matmul of the per-group loop runs). Its worth there is the
// device offsets: no host wait. QUINTET_GROUPED_GEMM=wgmma (grouped_wgmma) takes the Hopper FP8
// kernel for the shapes the mma.sync one takes (lib/nn/cuda/grouped_gemm_sm90a.cu: wgmma
// m64n128k32, E4M3 x E4M3 forward, E5M2 x E4M3 dgrad and wgrad, both operands K-major: the
// casts' data and transposes as above; the bf16 wgmma kernel's tiles and pipeline; the wgmma
// accumulators summed into f32 every 512 of K, as CUTLASS's FP8 GEMMs; the inverse scales in the
// epilogue), else today's kernels; on a GPU that is not sm_90 it throws. Opt-in:
// written without a GPU (its layouts checked by an emulation only). What the next GPU session
// must measure before it becomes the default of FP8 calls without host offsets on sm_90 (the MoE
// experts at ep = 1, which now take the emulated mma.sync kernel): tests/gpu/
// nn_grouped_fp8_test.cpp passing on an H100/H200, and 09_op_bench --experts-only's FP8 table
// (docs/PERFORMANCE.md) showing its TFLOP/s above the mma.sync kernel's on all six products,
// even and skewed (--expert-skew 1).

// y_g = q(x_g) · q(w_g)ᵀ. x.data [n, in], w.data [G, out, in]. Returns y [n, out] of dtype out
// (f32 or bf16; f32 on the CPU).
Tensor grouped_fp8_linear_forward(const Fp8Tensor& x, const Fp8Tensor& w, const Tensor& offsets,
                                  std::span<const std::int64_t> host_offsets, DType out,
                                  bool fast_accum, const Stream& stream);
// dx_g = q(dy_g) · q(w_g). dy.data [n, out], w.transposed [in, G out] (w.data may be undefined).
// Returns dx [n, in] of dtype out (as above).
Tensor grouped_fp8_linear_backward_input(const Fp8Tensor& dy, const Fp8Tensor& w,
                                         const Tensor& offsets,
                                         std::span<const std::int64_t> host_offsets, DType out,
                                         const Stream& stream);
// dw_g += q(dy_g)ᵀ · q(x_g), accumulated in f32. dy.transposed [out, n], x.transposed [in, n]
// (their data may be undefined), dw [G, out, in] f32, contiguous. An empty group leaves dw_g.
void grouped_fp8_linear_backward_weight(const Fp8Tensor& dy, const Fp8Tensor& x,
                                        const Tensor& offsets, const Tensor& dw,
                                        std::span<const std::int64_t> host_offsets,
                                        const Stream& stream);
// The same with accumulate = false: dw overwritten, as grouped_linear_backward_weight's
// (fp8_gemm with accumulate = false per group on the CPU and the per_group loop; the grouped
// kernels' dw zero-filled first).
void grouped_fp8_linear_backward_weight(const Fp8Tensor& dy, const Fp8Tensor& x,
                                        const Tensor& offsets, const Tensor& dw,
                                        std::span<const std::int64_t> host_offsets, bool accumulate,
                                        const Stream& stream);

enum class GroupedGemmPath { per_group, grouped_kernel, grouped_wgmma };
// The path a GPU call takes (above): grouped_wgmma with QUINTET_GROUPED_GEMM=wgmma; else
// grouped_kernel without host offsets or with QUINTET_GROUPED_GEMM=kernel; else per_group. Throws
// InvalidArgument when QUINTET_GROUPED_GEMM is set to anything but "kernel", "wgmma" or "loop"
// (the default).
GroupedGemmPath grouped_gemm_path(bool host_offsets_given);
// Whether a caller holding only device offsets (the MoE experts at ep = 1,
// parallel/expert/experts.hpp) should read them on the host (one wait) to take the per-group
// loop: yes unless QUINTET_GROUPED_GEMM is "kernel" or "wgmma", for bf16/f32 and FP8 alike. The
// per-expert cuBLASLt
// loop is the fastest measured (docs/PERFORMANCE.md, "Grouped expert GEMMs"): bf16 1.3x our wgmma
// kernel, FP8 2.1-2.5x our FP8 wgmma kernel on an H100. So a benchmark compares the kernels with
// the loop in one build. Throws as grouped_gemm_path.
bool grouped_gemm_wants_host_offsets();

// The offsets of consecutive groups of counts[g] rows: {0, c_0, c_0 + c_1, ...} (G + 1 values).
// Throws InvalidArgument for a negative count.
std::vector<std::int64_t> group_offsets(std::span<const std::int64_t> counts);

}  // namespace quintet::nn
