// The device dispatch of the grouped linear ops (quintet/nn/grouped_linear.hpp): check every
// argument, allocate the outputs, then run the CPU kernels (lib/nn/cpu/linear.cpp) or, on a GPU,
// the per-group cuBLASLt loop (lib/nn/cuda/linear.cu) or the grouped kernel
// (lib/nn/cuda/grouped_gemm.cu), as grouped_gemm_path says.
#include "quintet/nn/grouped_linear.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "nn/cpu/cpu_ops.hpp"
#include "nn/cuda/cuda_ops.hpp"
#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"

namespace quintet::nn {

using detail::OpChecker;

namespace {

// values (G + 1 of them) start at 0, never decrease and end at most at rows.
void check_offset_values(const OpChecker& c, const char* name, std::span<const std::int64_t> values,
                         std::int64_t rows) {
  QUINTET_CHECK(values.front() == 0, "{}: {}[0] = {}, expected 0", c.op(), name, values.front());
  for (std::size_t g = 0; g + 1 < values.size(); ++g) {
    QUINTET_CHECK(values[g + 1] >= values[g],
                  "{}: {} decrease at group {} ({} then {}); each group's rows follow the previous "
                  "group's (offsets are running sums of the counts)",
                  c.op(), name, g, values[g], values[g + 1]);
  }
  QUINTET_CHECK(values.back() <= rows, "{}: {} end at {} but there are only {} rows", c.op(), name,
                values.back(), rows);
}

// Checks offsets [groups + 1] i64 on the stream's device and the host copy when given (on the CPU
// the values too, and that the two agree). Returns offsets, contiguous.
Tensor check_offsets(const OpChecker& c, const Tensor& offsets, std::int64_t groups,
                     std::int64_t rows, std::span<const std::int64_t> host, const Stream& stream) {
  c.on_device("offsets", offsets);
  QUINTET_CHECK(
      offsets.dtype() == DType::i64 && offsets.dim() == 1 && offsets.size(0) == groups + 1,
      "{}: offsets are {} of {}; expected [{}] i64 (the first row of each of the {} "
      "groups, then the end)",
      c.op(), shape_str(offsets.shape()), dtype_name(offsets.dtype()), groups + 1, groups);
  if (!host.empty()) {
    QUINTET_CHECK(static_cast<std::int64_t>(host.size()) == groups + 1,
                  "{}: {} host_offsets for {} groups; expected {} (or none)", c.op(), host.size(),
                  groups, groups + 1);
    check_offset_values(c, "host_offsets", host, rows);
  }
  const Tensor o = offsets.contiguous(stream);
  if (!c.on_cuda()) {
    const std::span<const std::int64_t> values(o.data<std::int64_t>(),
                                               static_cast<std::size_t>(groups + 1));
    check_offset_values(c, "offsets", values, rows);
    QUINTET_CHECK(host.empty() || std::equal(host.begin(), host.end(), values.begin()),
                  "{}: host_offsets differ from offsets; pass the same values (or none)", c.op());
  }
  return o;
}

// w [G, out, in] of dtype t; returns G.
std::int64_t check_weights(const OpChecker& c, const Tensor& w, DType t) {
  c.compute_as("w", w, t);
  QUINTET_CHECK(w.dim() == 3, "{}: w has shape {}, expected [groups, out, in]", c.op(),
                shape_str(w.shape()));
  return w.size(0);
}

// a [rows, cols] of dtype t (2-D).
void check_rows(const OpChecker& c, const char* name, const Tensor& a, DType t, std::int64_t cols) {
  c.compute_as(name, a, t);
  QUINTET_CHECK(a.dim() == 2 && a.size(1) == cols, "{}: {} has shape {}, expected [rows, {}]",
                c.op(), name, shape_str(a.shape()), cols);
}

// Whether a GPU call runs the per-group cuBLASLt loop (else the grouped kernel); false on the CPU.
// Throws for a bad QUINTET_GROUPED_GEMM, before any work.
bool per_group_on_gpu(const OpChecker& c, std::span<const std::int64_t> host) {
  return c.on_cuda() && grouped_gemm_path(!host.empty()) == GroupedGemmPath::per_group;
}

#if QUINTET_NN_HAS_CUDA_OPS

// Calls f(g, first row, rows) for each non-empty group of the host offsets.
template <class F>
void for_each_host_group(std::span<const std::int64_t> o, F&& f) {
  for (std::size_t g = 0; g + 1 < o.size(); ++g) {
    if (o[g + 1] > o[g]) f(static_cast<std::int64_t>(g), o[g], o[g + 1] - o[g]);
  }
}

// Zeroes the padding rows [o_G, rows) of out on stream.
void zero_padding(const Tensor& out, std::span<const std::int64_t> o, const Stream& stream) {
  if (o.back() < out.size(0)) out.narrow(0, o.back(), out.size(0) - o.back()).fill_(0.0, stream);
}
#endif

}  // namespace

GroupedGemmPath grouped_gemm_path(bool host_offsets_given) {
  const char* env = std::getenv("QUINTET_GROUPED_GEMM");
  const std::string choice = env != nullptr ? env : "";
  QUINTET_CHECK(choice.empty() || choice == "kernel" || choice == "loop",
                "QUINTET_GROUPED_GEMM={}: expected kernel or loop (the default)", choice);
  if (!host_offsets_given || choice == "kernel") return GroupedGemmPath::grouped_kernel;
  return GroupedGemmPath::per_group;
}

std::vector<std::int64_t> group_offsets(std::span<const std::int64_t> counts) {
  std::vector<std::int64_t> offsets(counts.size() + 1, 0);
  for (std::size_t g = 0; g < counts.size(); ++g) {
    QUINTET_CHECK(counts[g] >= 0, "group_offsets: count {} of group {} is negative", counts[g], g);
    offsets[g + 1] = offsets[g] + counts[g];
  }
  return offsets;
}

namespace {
// forward (y = x · w_gᵀ, a = x [n, in]) or backward_input (dx = dy · w_g, a = dy [n, out]): the
// two products of a [n, k] by each group's weight into [n, cols].
Tensor grouped_product(bool forward, const Tensor& a, const Tensor& w, const Tensor& offsets,
                       std::span<const std::int64_t> host_offsets, const Stream& stream) {
  const OpChecker c(forward ? "grouped_linear_forward" : "grouped_linear_backward_input", stream);
  const char* name = forward ? "x" : "dy";
  const DType t = c.compute(name, a);
  const std::int64_t groups = check_weights(c, w, t);
  const std::int64_t k = forward ? w.size(2) : w.size(1), cols = forward ? w.size(1) : w.size(2);
  check_rows(c, name, a, t, k);
  const std::int64_t n = a.size(0);
  const Tensor o = check_offsets(c, offsets, groups, n, host_offsets, stream);
  [[maybe_unused]] const bool per_group = per_group_on_gpu(c, host_offsets);
  const Tensor a2 = a.contiguous(stream), w2 = w.contiguous(stream);
  Tensor out = Tensor::empty({n, cols}, t, c.device(), stream);
  if (!c.on_cuda()) {
    if (forward) {
      cpu_ops::grouped_linear_forward(a2, w2, o, out);
    } else {
      cpu_ops::grouped_linear_backward_input(a2, w2, o, out);
    }
    return out;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (!per_group) {
    if (forward) {
      cuda_ops::grouped_linear_forward(a2, w2, o, out, stream);
    } else {
      cuda_ops::grouped_linear_backward_input(a2, w2, o, out, stream);
    }
    return out;
  }
  for_each_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    const Tensor ag = a2.narrow(0, r, m), og = out.narrow(0, r, m);
    if (forward) {
      cuda_ops::linear_forward(ag, w2.select(g), Tensor(), og, stream);
    } else {
      cuda_ops::linear_backward_input(ag, w2.select(g), og, stream);
    }
  });
  zero_padding(out, host_offsets, stream);
#endif
  return out;
}
}  // namespace

Tensor grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                              std::span<const std::int64_t> host_offsets, const Stream& stream) {
  return grouped_product(true, x, w, offsets, host_offsets, stream);
}

Tensor grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                     std::span<const std::int64_t> host_offsets,
                                     const Stream& stream) {
  return grouped_product(false, dy, w, offsets, host_offsets, stream);
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, std::span<const std::int64_t> host_offsets,
                                    const Stream& stream) {
  const OpChecker c("grouped_linear_backward_weight", stream);
  const DType t = c.compute("dy", dy);
  c.compute_as("x", x, t);
  QUINTET_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0),
                "{}: dy {} and x {} must be [rows, out] and [rows, in] of the same rows", c.op(),
                shape_str(dy.shape()), shape_str(x.shape()));
  QUINTET_CHECK(dw.defined() && dw.dim() == 3, "{}: dw has shape {}, expected [groups, {}, {}]",
                c.op(), dw.defined() ? shape_str(dw.shape()) : std::string("(undefined)"),
                dy.size(1), x.size(1));
  const std::int64_t groups = dw.size(0), n = dy.size(0);
  c.accumulator("dw", dw, t, {groups, dy.size(1), x.size(1)});
  const Tensor o = check_offsets(c, offsets, groups, n, host_offsets, stream);
  [[maybe_unused]] const bool per_group = per_group_on_gpu(c, host_offsets);
  const Tensor dy2 = dy.contiguous(stream), x2 = x.contiguous(stream);
  if (!c.on_cuda()) {
    cpu_ops::grouped_linear_backward_weight(dy2, x2, o, dw);
    return;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (!per_group) {
    cuda_ops::grouped_linear_backward_weight(dy2, x2, o, dw, stream);
    return;
  }
  for_each_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    cuda_ops::linear_backward_weight(dy2.narrow(0, r, m), x2.narrow(0, r, m), dw.select(g),
                                     Tensor(), stream);
  });
#endif
}

}  // namespace quintet::nn
