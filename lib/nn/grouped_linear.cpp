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

using detail::check_scale_tensor;
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

// The path of a GPU call (anything on the CPU). Throws for a bad QUINTET_GROUPED_GEMM, before any
// work.
GroupedGemmPath gpu_path(const OpChecker& c, std::span<const std::int64_t> host) {
  return c.on_cuda() ? grouped_gemm_path(!host.empty()) : GroupedGemmPath::grouped_kernel;
}

#if QUINTET_NN_HAS_CUDA_OPS

// Calls f(g, first row, rows) for each non-empty group of the host offsets.
template <class F>
void for_each_host_group(std::span<const std::int64_t> o, F&& f) {
  for (std::size_t g = 0; g + 1 < o.size(); ++g) {
    if (o[g + 1] > o[g]) f(static_cast<std::int64_t>(g), o[g], o[g + 1] - o[g]);
  }
}

// Calls f(g, first row, rows) for every group of the host offsets, empty ones too (rows 0).
template <class F>
void for_every_host_group(std::span<const std::int64_t> o, F&& f) {
  for (std::size_t g = 0; g + 1 < o.size(); ++g) {
    f(static_cast<std::int64_t>(g), o[g], o[g + 1] - o[g]);
  }
}

// Fills t with zeros on stream (nothing for no elements).
void fill_zero(const Tensor& t, const Stream& stream) {
  if (t.numel() > 0) Tensor(t).fill_(0.0, stream);
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
  QUINTET_CHECK(choice.empty() || choice == "kernel" || choice == "wgmma" || choice == "loop",
                "QUINTET_GROUPED_GEMM={}: expected kernel, wgmma or loop (the default)", choice);
  if (choice == "wgmma") return GroupedGemmPath::grouped_wgmma;
  if (!host_offsets_given || choice == "kernel") return GroupedGemmPath::grouped_kernel;
  return GroupedGemmPath::per_group;
}

bool grouped_gemm_wants_host_offsets() {
  return grouped_gemm_path(true) == GroupedGemmPath::per_group;  // checks the variable
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
  [[maybe_unused]] const GroupedGemmPath path = gpu_path(c, host_offsets);
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
  if (path != GroupedGemmPath::per_group) {
    const bool wgmma = path == GroupedGemmPath::grouped_wgmma;
    if (forward) {
      cuda_ops::grouped_linear_forward(a2, w2, o, out, wgmma, stream);
    } else {
      cuda_ops::grouped_linear_backward_input(a2, w2, o, out, wgmma, stream);
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
  grouped_linear_backward_weight(dy, x, offsets, dw, host_offsets, true, stream);
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, std::span<const std::int64_t> host_offsets,
                                    bool accumulate, const Stream& stream) {
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
  [[maybe_unused]] const GroupedGemmPath path = gpu_path(c, host_offsets);
  const Tensor dy2 = dy.contiguous(stream), x2 = x.contiguous(stream);
  if (!c.on_cuda()) {
    cpu_ops::grouped_linear_backward_weight(dy2, x2, o, dw, accumulate);
    return;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (path != GroupedGemmPath::per_group) {
    if (!accumulate) fill_zero(dw, stream);  // the kernels add into dw
    cuda_ops::grouped_linear_backward_weight(dy2, x2, o, dw, path == GroupedGemmPath::grouped_wgmma,
                                             stream);
    return;
  }
  // Every group, an empty one too: its dw_g is zeroed when !accumulate (rows 0, beta 0).
  for_every_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    cuda_ops::linear_backward_weight(dy2.narrow(0, r, m), x2.narrow(0, r, m), dw.select(g),
                                     Tensor(), accumulate, stream);
  });
#else
  (void)accumulate;
#endif
}

// ---- FP8 ---------------------------------------------------------------------------------------

namespace {

// One part (data or transposed) of an FP8 operand: u8 of `dims` dimensions, contiguous, on the
// device, with its scale tensor.
const Tensor& check_fp8_part(const OpChecker& c, const char* name, const Fp8Tensor& q,
                             bool transposed, std::int64_t dims) {
  const Tensor& t = transposed ? q.transposed : q.data;
  const char* part = transposed ? ".transposed" : ".data";
  QUINTET_CHECK(t.defined(), "{}: {}{} is undefined (fp8_cast with transposed = {})", c.op(), name,
                part, transposed);
  c.on_device(name, t);
  QUINTET_CHECK(t.dtype() == DType::u8 && t.dim() == dims && (t.is_contiguous() || t.numel() == 0),
                "{}: {}{} is {} {}, expected a contiguous u8 tensor of {} dimensions", c.op(), name,
                part, dtype_name(t.dtype()), shape_str(t.shape()), dims);
  check_scale_tensor(c, name, q.scale);
  return t;
}

void check_fp8_formats(const OpChecker& c, const Fp8Tensor& a, const Fp8Tensor& b) {
  QUINTET_CHECK(a.format == Fp8Format::e4m3 || b.format == Fp8Format::e4m3,
                "{}: both operands are E5M2; FP8 GEMMs take E4M3 by E4M3 or E5M2", c.op());
}

// The output dtype: f32 or bf16 on a GPU, f32 on the CPU.
void check_fp8_out(const OpChecker& c, DType out) {
  QUINTET_CHECK(out == DType::f32 || (c.on_cuda() && out == DType::bf16),
                "{}: out = {}; expected f32{}", c.op(), dtype_name(out),
                c.on_cuda() ? " or bf16" : " on the CPU");
}

#if QUINTET_NN_HAS_CUDA_OPS
// The columns [first, first + count) of t [rows, cols], contiguous (a copy): a group's slice of a
// transposed operand, as the per-group cuBLASLt loop reads it.
Tensor columns(const Tensor& t, std::int64_t first, std::int64_t count, const Stream& stream) {
  return t.narrow(1, first, count).contiguous(stream);
}
#endif

}  // namespace

Tensor grouped_fp8_linear_forward(const Fp8Tensor& x, const Fp8Tensor& w, const Tensor& offsets,
                                  std::span<const std::int64_t> host_offsets, DType out,
                                  bool fast_accum, const Stream& stream) {
  const OpChecker c("grouped_fp8_linear_forward", stream);
  const Tensor& xd = check_fp8_part(c, "x", x, false, 2);
  const Tensor& wd = check_fp8_part(c, "w", w, false, 3);
  check_fp8_formats(c, x, w);
  check_fp8_out(c, out);
  const std::int64_t n = xd.size(0), in = xd.size(1), groups = wd.size(0), cols = wd.size(1);
  QUINTET_CHECK(wd.size(2) == in,
                "{}: x.data is {} and w.data {}; expected [n, in] and [G, out, in]", c.op(),
                shape_str(xd.shape()), shape_str(wd.shape()));
  const Tensor o = check_offsets(c, offsets, groups, n, host_offsets, stream);
  [[maybe_unused]] const GroupedGemmPath path = gpu_path(c, host_offsets);
  [[maybe_unused]] const bool per_group = path == GroupedGemmPath::per_group;
  Tensor y = Tensor::empty({n, cols}, out, c.device(), stream);
  if (!c.on_cuda()) {
    cpu_ops::grouped_fp8_linear_forward(xd, x.scale, x.format, wd, w.scale, w.format, o, y);
    return y;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (!per_group) {
    cuda_ops::grouped_fp8_gemm(cuda_ops::GroupedFp8Product::forward, xd, x.scale, x.format, wd,
                               w.scale, w.format, o, y, path == GroupedGemmPath::grouped_wgmma,
                               stream);
    return y;
  }
  for_each_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    cuda_ops::fp8_gemm(xd.narrow(0, r, m), x.scale, x.format, wd.select(g), w.scale, w.format,
                       Tensor(), y.narrow(0, r, m), false, fast_accum, stream);
  });
  zero_padding(y, host_offsets, stream);
#else
  (void)fast_accum;
#endif
  return y;
}

Tensor grouped_fp8_linear_backward_input(const Fp8Tensor& dy, const Fp8Tensor& w,
                                         const Tensor& offsets,
                                         std::span<const std::int64_t> host_offsets, DType out,
                                         const Stream& stream) {
  const OpChecker c("grouped_fp8_linear_backward_input", stream);
  const Tensor& dyd = check_fp8_part(c, "dy", dy, false, 2);
  const Tensor& wt = check_fp8_part(c, "w", w, true, 2);
  check_fp8_formats(c, dy, w);
  check_fp8_out(c, out);
  const std::int64_t n = dyd.size(0), cols = dyd.size(1), in = wt.size(0);
  const std::int64_t groups = offsets.defined() && offsets.dim() == 1 ? offsets.size(0) - 1 : -1;
  QUINTET_CHECK(groups >= 0 && wt.size(1) == groups * cols,
                "{}: dy.data is {} and w.transposed {} with offsets {}; expected [n, out], "
                "[in, G out] and [G + 1]",
                c.op(), shape_str(dyd.shape()), shape_str(wt.shape()),
                offsets.defined() ? shape_str(offsets.shape()) : std::string("undefined"));
  const Tensor o = check_offsets(c, offsets, groups, n, host_offsets, stream);
  [[maybe_unused]] const GroupedGemmPath path = gpu_path(c, host_offsets);
  [[maybe_unused]] const bool per_group = path == GroupedGemmPath::per_group;
  Tensor dx = Tensor::empty({n, in}, out, c.device(), stream);
  if (!c.on_cuda()) {
    cpu_ops::grouped_fp8_linear_backward_input(dyd, dy.scale, dy.format, wt, w.scale, w.format, o,
                                               dx);
    return dx;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (!per_group) {
    cuda_ops::grouped_fp8_gemm(cuda_ops::GroupedFp8Product::dgrad, dyd, dy.scale, dy.format, wt,
                               w.scale, w.format, o, dx, path == GroupedGemmPath::grouped_wgmma,
                               stream);
    return dx;
  }
  for_each_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    cuda_ops::fp8_gemm(dyd.narrow(0, r, m), dy.scale, dy.format,
                       columns(wt, g * cols, cols, stream), w.scale, w.format, Tensor(),
                       dx.narrow(0, r, m), false, false, stream);
  });
  zero_padding(dx, host_offsets, stream);
#endif
  return dx;
}

void grouped_fp8_linear_backward_weight(const Fp8Tensor& dy, const Fp8Tensor& x,
                                        const Tensor& offsets, const Tensor& dw,
                                        std::span<const std::int64_t> host_offsets,
                                        const Stream& stream) {
  grouped_fp8_linear_backward_weight(dy, x, offsets, dw, host_offsets, true, stream);
}

void grouped_fp8_linear_backward_weight(const Fp8Tensor& dy, const Fp8Tensor& x,
                                        const Tensor& offsets, const Tensor& dw,
                                        std::span<const std::int64_t> host_offsets, bool accumulate,
                                        const Stream& stream) {
  const OpChecker c("grouped_fp8_linear_backward_weight", stream);
  const Tensor& dyt = check_fp8_part(c, "dy", dy, true, 2);
  const Tensor& xt = check_fp8_part(c, "x", x, true, 2);
  check_fp8_formats(c, dy, x);
  QUINTET_CHECK(dyt.size(1) == xt.size(1),
                "{}: dy.transposed {} and x.transposed {} must be [out, n] and [in, n] of the "
                "same rows",
                c.op(), shape_str(dyt.shape()), shape_str(xt.shape()));
  QUINTET_CHECK(dw.defined() && dw.dim() == 3, "{}: dw has shape {}, expected [groups, {}, {}]",
                c.op(), dw.defined() ? shape_str(dw.shape()) : std::string("(undefined)"),
                dyt.size(0), xt.size(0));
  const std::int64_t groups = dw.size(0), n = dyt.size(1);
  c.accumulator("dw", dw, DType::f32, {groups, dyt.size(0), xt.size(0)});
  const Tensor o = check_offsets(c, offsets, groups, n, host_offsets, stream);
  [[maybe_unused]] const GroupedGemmPath path = gpu_path(c, host_offsets);
  [[maybe_unused]] const bool per_group = path == GroupedGemmPath::per_group;
  if (!c.on_cuda()) {
    cpu_ops::grouped_fp8_linear_backward_weight(dyt, dy.scale, dy.format, xt, x.scale, x.format, o,
                                                dw, accumulate);
    return;
  }
#if QUINTET_NN_HAS_CUDA_OPS
  const DeviceGuard guard(c.device());
  if (!per_group) {
    if (!accumulate) fill_zero(dw, stream);  // the kernels add into dw
    cuda_ops::grouped_fp8_gemm(cuda_ops::GroupedFp8Product::wgrad, dyt, dy.scale, dy.format, xt,
                               x.scale, x.format, o, dw, path == GroupedGemmPath::grouped_wgmma,
                               stream);
    return;
  }
  for_every_host_group(host_offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    if (m > 0) {
      cuda_ops::fp8_gemm(columns(dyt, r, m, stream), dy.scale, dy.format, columns(xt, r, m, stream),
                         x.scale, x.format, Tensor(), dw.select(g), accumulate, false, stream);
    } else if (!accumulate) {
      fill_zero(dw.select(g), stream);
    }
  });
#else
  (void)accumulate;
#endif
}

}  // namespace quintet::nn
