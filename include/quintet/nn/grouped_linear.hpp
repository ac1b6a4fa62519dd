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
// bit for bit what a loop of nn::linear_* per group gives. GPU: with host offsets, the loop of
// per-group cuBLASLt GEMMs of nn::linear_* (the proven path; it needs the counts on the host);
// without them, InvalidArgument for now (a grouped kernel reading the offsets on the device is
// the next step of issue #47).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

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

// The offsets of consecutive groups of counts[g] rows: {0, c_0, c_0 + c_1, ...} (G + 1 values).
// Throws InvalidArgument for a negative count.
std::vector<std::int64_t> group_offsets(std::span<const std::int64_t> counts);

}  // namespace quintet::nn
