// The MoE layer's permutation of its tokens' assignments by expert and the weighted combine that
// undoes it (parallel/expert/permute.cpp; the CUDA kernels in parallel/expert/cuda/moe_kernels.cu).
// Device-generic: CPU tensors run here, CUDA tensors on stream as kernels (no host wait).
//
// For n tokens with k assignments each (experts / kept [n, k], row-major: assignment a = t k + j),
// the kept assignments are sorted by expert, then by a (token, then choice): stable and
// deterministic. Sorted row i (i < sum of counts) carries token rows_of[i]; assignment a is sorted
// row slot[a], or -1 when dropped.
#pragma once

#include <cstdint>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::expert {

struct Permutation {
  Tensor counts;   // [E] i64: kept assignments per expert
  Tensor rows_of;  // [n k] i32: the token of each sorted row (-1 past the kept ones)
  Tensor slot;     // [n, k] i32: each assignment's sorted row, -1 when dropped
};
Permutation permute(const Tensor& experts, const Tensor& kept, std::int64_t num_experts,
                    const Stream& stream);

// [n, d] = sum over the kept assignments of token t of weights[t, j] * rows[slot[t, j]] (weights
// undefined: 1, the backward of the gather by rows_of). rows [>= sorted rows, d].
Tensor combine_rows(const Tensor& rows, const Tensor& slot, const Tensor& weights,
                    const Stream& stream);
// The backward of combine for dy [n, d]: d(rows) [rows.size(0), d] (rows[slot] = w * dy[t]) and
// d(weights) [n, k] f32 (dy[t] . rows[slot], 0 when dropped).
struct CombineGrads {
  Tensor drows, dweights;
};
CombineGrads combine_rows_backward(const Tensor& dy, const Tensor& rows, const Tensor& slot,
                                   const Tensor& weights, const Stream& stream);

}  // namespace quintet::expert
