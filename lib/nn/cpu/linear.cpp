// CPU linear: Eigen GEMMs on row-major maps (y = x·wᵀ + b and its two backward products).
#include "nn/cpu/cpu_common.hpp"
#include "nn/cpu/cpu_ops.hpp"

namespace quintet::nn::cpu_ops {

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  dispatch_real(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    auto ym = mat<T>(y, m, out);
    ym.noalias() = cmat<T>(x, m, in) * cmat<T>(w, out, in).transpose();
    if (b.defined()) ym.rowwise() += cmat<T>(b, 1, out).row(0);
  });
}

void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = dy.size(0), out = w.size(0), in = w.size(1);
    mat<T>(dx, m, in).noalias() = cmat<T>(dy, m, out) * cmat<T>(w, out, in);
  });
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            bool accumulate_dw) {
  dispatch_real(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t m = dy.size(0), out = dy.size(1), in = x.size(1);
    const auto dym = cmat<T>(dy, m, out);
    if (accumulate_dw) {
      mat<T>(dw, out, in).noalias() += dym.transpose() * cmat<T>(x, m, in);
    } else {
      mat<T>(dw, out, in).noalias() = dym.transpose() * cmat<T>(x, m, in);
    }
    if (db.defined()) mat<T>(db, 1, out) += dym.colwise().sum();
  });
}

}  // namespace quintet::nn::cpu_ops

// ---- grouped: the kernels above on each group's rows (so a loop of linear ops per group gives
// the same bits), the padding rows past the last group zeroed ----

namespace quintet::nn::cpu_ops {

namespace {
// Calls f(g, first row, rows) for each non-empty group; returns offsets[G].
template <class F>
std::int64_t for_each_group(const Tensor& offsets, F&& f) {
  const std::int64_t* o = offsets.data<std::int64_t>();
  const std::int64_t groups = offsets.numel() - 1;
  for (std::int64_t g = 0; g < groups; ++g) {
    if (o[g + 1] > o[g]) f(g, o[g], o[g + 1] - o[g]);
  }
  return o[groups];
}
// Calls f(g, first row, rows) for each group, empty ones too (rows 0).
template <class F>
void for_every_group(const Tensor& offsets, F&& f) {
  const std::int64_t* o = offsets.data<std::int64_t>();
  for (std::int64_t g = 0; g + 1 < offsets.numel(); ++g) f(g, o[g], o[g + 1] - o[g]);
}
// Zeroes rows [from, rows) of out [rows, cols].
void zero_rows_from(const Tensor& out, std::int64_t from) {
  if (from < out.size(0)) out.narrow(0, from, out.size(0) - from).zero_();
}
}  // namespace

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& y) {
  const std::int64_t end =
      for_each_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
        linear_forward(x.narrow(0, r, m), w.select(g), Tensor(), y.narrow(0, r, m));
      });
  zero_rows_from(y, end);
}

void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dx) {
  const std::int64_t end =
      for_each_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
        linear_backward_input(dy.narrow(0, r, m), w.select(g), dx.narrow(0, r, m));
      });
  zero_rows_from(dx, end);
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& dw, bool accumulate) {
  for_every_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    if (m > 0) {
      linear_backward_weight(dy.narrow(0, r, m), x.narrow(0, r, m), dw.select(g), Tensor(),
                             accumulate);
    } else if (!accumulate) {
      dw.select(g).zero_();
    }
  });
}

// FP8: per group, fp8_gemm's emulation on the group's slices (contiguous copies of the
// transposes' column ranges), so a loop of fp8_gemm over per-group casts gives the same bits.

namespace {
Tensor columns(const Tensor& t, std::int64_t first, std::int64_t count) {
  return t.narrow(1, first, count).contiguous();
}
}  // namespace

void grouped_fp8_linear_forward(const Tensor& x, const Tensor& x_scale, Fp8Format x_format,
                                const Tensor& w, const Tensor& w_scale, Fp8Format w_format,
                                const Tensor& offsets, const Tensor& y) {
  const std::int64_t end =
      for_each_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
        fp8_gemm(x.narrow(0, r, m), x_scale, x_format, w.select(g), w_scale, w_format, Tensor(),
                 y.narrow(0, r, m), false, false);
      });
  zero_rows_from(y, end);
}

void grouped_fp8_linear_backward_input(const Tensor& dy, const Tensor& dy_scale,
                                       Fp8Format dy_format, const Tensor& wt, const Tensor& w_scale,
                                       Fp8Format w_format, const Tensor& offsets,
                                       const Tensor& dx) {
  const std::int64_t out = dy.size(1);
  const std::int64_t end =
      for_each_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
        fp8_gemm(dy.narrow(0, r, m), dy_scale, dy_format, columns(wt, g * out, out), w_scale,
                 w_format, Tensor(), dx.narrow(0, r, m), false, false);
      });
  zero_rows_from(dx, end);
}

void grouped_fp8_linear_backward_weight(const Tensor& dyt, const Tensor& dy_scale,
                                        Fp8Format dy_format, const Tensor& xt,
                                        const Tensor& x_scale, Fp8Format x_format,
                                        const Tensor& offsets, const Tensor& dw, bool accumulate) {
  for_every_group(offsets, [&](std::int64_t g, std::int64_t r, std::int64_t m) {
    if (m > 0) {
      fp8_gemm(columns(dyt, r, m), dy_scale, dy_format, columns(xt, r, m), x_scale, x_format,
               Tensor(), dw.select(g), accumulate, false);
    } else if (!accumulate) {
      dw.select(g).zero_();
    }
  });
}

}  // namespace quintet::nn::cpu_ops
