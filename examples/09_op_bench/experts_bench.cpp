// The experts mode of 09_op_bench: see experts_bench.hpp.
//
// Row-major [rows, cols] buffers are column-major [cols, rows] to cuBLAS, so each row-major
// product of one expert (n rows, a layer w [out, in]) is written as its transpose, the mapping of
// lib/nn/cuda/linear.cu:
//   forward          y [n, out] = x [n, in]·wᵀ
//                    -> yᵀ [out, n] = op_T(w as [in, out]) · (x as [in, n])
//   backward_input   dx [n, in] = dy [n, out]·w
//                    -> dxᵀ [in, n] = (w as [in, out]) · (dy as [out, n])
//   backward_weight  dw [out, in] += dyᵀ·x
//                    -> dwᵀ [in, out] += (x as [in, n]) · op_T(dy as [out, n])
// The grouped results are checked against the loop's before anything is timed.
#include "experts_bench.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grouped_gemm.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/fp8.hpp"
#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/ops.hpp"
#include "timing.hpp"

using namespace quintet;

namespace {

constexpr double kBf16Tolerance = 1e-2;  // max |diff| / max |loop| for a bf16 result
constexpr double kF32Tolerance = 1e-3;   // for an f32 dw
constexpr int kWarmup = 3;

// max |got - ref| / max |ref| (max |got - ref| when ref is all zero); infinity when got holds a
// NaN or an infinity.
double max_rel_diff(const std::vector<float>& ref, const Tensor& got) {
  const std::vector<float> g = got.to_vector<float>();
  if (g.size() != ref.size()) throw std::logic_error("max_rel_diff: sizes differ");
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return std::numeric_limits<double>::infinity();
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(g[i]) - ref[i]));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

// One linear of every expert: w [E, out, in], its input x [T, in] and the gradient of its output
// dy [T, out] (T = the rows of all experts).
struct Layer {
  const char* name;
  std::int64_t in, out;
  Tensor w, x, dy;
};

enum class Pass { forward, backward_input, backward_weight };

const char* pass_name(Pass p) {
  return p == Pass::forward          ? "forward"
         : p == Pass::backward_input ? "backward_input"
                                     : "backward_weight";
}

// What every product shares: the rows of the experts, the stream, the options.
struct Setup {
  const ExpertBenchOptions& opt;
  const Stream& s;
  std::vector<std::int64_t> rows, offsets;
  std::int64_t total = 0;
  Grouping grouping = Grouping::by_shape;
  Tensor device_offsets;  // [E + 1] i64: offsets, then total (the grouped kernel's)
  bool hopper = false;    // the GPU is sm_90: the wgmma kernel is measured too

  // fn(e, offset, rows) for every expert with rows, in order.
  template <class F>
  void for_each_expert(F&& fn) const {
    for (std::size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] > 0) fn(static_cast<std::int64_t>(e), offsets[e], rows[e]);
    }
  }
};

// The column-major problems of pass over every non-empty expert (the mapping at the top of this
// file). out: y [T, out] (forward), dx [T, in] (backward_input), dw [E, out, in]
// (backward_weight).
std::vector<GemmProblem> expert_problems(const Setup& c, Pass pass, const Layer& l,
                                         const Tensor& out) {
  std::vector<GemmProblem> problems;
  c.for_each_expert([&](std::int64_t e, std::int64_t off, std::int64_t n) {
    const Tensor w = l.w.select(e);
    GemmProblem p;
    switch (pass) {
      case Pass::forward:  // yᵀ [out, n] = op_T(w as [in, out]) · (x as [in, n])
        p.trans_a = true;
        p.m = l.out;
        p.n = n;
        p.k = l.in;
        p.a = w.data_ptr();
        p.lda = l.in;
        p.b = l.x.narrow(0, off, n).data_ptr();
        p.ldb = l.in;
        p.c = out.narrow(0, off, n).data_ptr();
        p.ldc = l.out;
        break;
      case Pass::backward_input:  // dxᵀ [in, n] = (w as [in, out]) · (dy as [out, n])
        p.m = l.in;
        p.n = n;
        p.k = l.out;
        p.a = w.data_ptr();
        p.lda = l.in;
        p.b = l.dy.narrow(0, off, n).data_ptr();
        p.ldb = l.out;
        p.c = out.narrow(0, off, n).data_ptr();
        p.ldc = l.in;
        break;
      case Pass::backward_weight:  // dwᵀ [in, out] += (x as [in, n]) · op_T(dy as [out, n])
        p.trans_b = true;
        p.m = l.in;
        p.n = l.out;
        p.k = n;
        p.a = l.x.narrow(0, off, n).data_ptr();
        p.lda = l.in;
        p.b = l.dy.narrow(0, off, n).data_ptr();
        p.ldb = l.out;
        p.c = out.select(e).data_ptr();
        p.ldc = l.in;
        break;
    }
    problems.push_back(p);
  });
  return problems;
}

// One product measured: the loop, the grouped call with its pointer arrays already on the device,
// and the grouped call after a copy of them.
struct Result {
  std::string product;       // e.g. "fc_forward"
  std::string grouped_path;  // what the grouped side runs
  std::string out_dtype;     // of the grouped result
  bool in_total = true;
  int groups = 0, problems = 0;
  double flops = 0.0;
  double loop_ms = 0.0, grouped_ms = 0.0, upload_ms = 0.0;
  double diff = 0.0, diff_upload = 0.0, tolerance = 0.0;
  // Our grouped kernel (nn::grouped_linear_* without host offsets): one launch over every expert.
  double kernel_ms = 0.0, kernel_diff = 0.0;
  // The same with QUINTET_GROUPED_GEMM=wgmma (the Hopper kernel; sm_90 only, else 0).
  double wgmma_ms = 0.0, wgmma_diff = 0.0;
  std::string f32_c_status;  // backward_weight: what cuBLAS said to bf16 A/B with an f32 C
};

// Zeroes `zero_first`, runs fn once and compares got with ref; throws above tolerance.
double verify(const Setup& c, const std::string& what, const std::vector<float>& ref,
              const Tensor& got, const std::vector<Tensor>& zero_first,
              const std::function<void()>& fn, double tolerance) {
  for (Tensor t : zero_first) t.fill_(0.0, c.s);  // a handle: fills the caller's tensor
  fn();
  c.s.synchronize();
  const double d = max_rel_diff(ref, got);
  if (!(d <= tolerance)) {
    throw std::runtime_error("experts: " + what +
                             ": the grouped result differs from the loop's: max |diff| / max "
                             "|loop| = " +
                             std::to_string(d) + " > " + std::to_string(tolerance) +
                             " (check the column-major mapping in experts_bench.cpp)");
  }
  return d;
}

// Checks, then times into r the grouped step: g.run, then `after` (when set), and the same after an
// upload of g's pointer arrays. zero_first: the tensors the step writes, zeroed before a check.
void verify_and_time(const Setup& c, Result& r, GroupedGemm& g, const std::vector<float>& ref,
                     const Tensor& got, const std::vector<Tensor>& zero_first,
                     const std::function<void()>& after, double tolerance) {
  const cudaStream_t h = c.s.handle();
  const std::function<void()> grouped = [&] {
    g.run(h);
    if (after) after();
  };
  const std::function<void()> upload = [&] {
    g.upload_and_run(h);
    if (after) after();
  };
  r.groups = g.group_count();
  r.problems = g.problem_count();
  r.flops = g.flops();
  r.tolerance = tolerance;
  r.diff = verify(c, r.product, ref, got, zero_first, grouped, tolerance);
  // Stale device pointer arrays must not be what the multiply reads after an upload.
  r.diff_upload = verify(
      c, r.product + " (upload)", ref, got, zero_first,
      [&] {
        g.clear_device_pointers(h);
        upload();
      },
      tolerance);
  r.grouped_ms = median_ms(c.s, kWarmup, c.opt.iters, grouped);
  r.upload_ms = median_ms(c.s, kWarmup, c.opt.iters, upload);
}

// Runs fn with QUINTET_GROUPED_GEMM=value (which grouped kernel nn::grouped_linear_* runs), then
// restores the variable as it was.
template <class F>
void with_grouped_gemm(const char* value, F&& fn) {
  const char* old = std::getenv("QUINTET_GROUPED_GEMM");
  const std::string saved = old != nullptr ? old : "";
  setenv("QUINTET_GROUPED_GEMM", value, 1);
  try {
    fn();
  } catch (...) {
    if (old != nullptr)
      setenv("QUINTET_GROUPED_GEMM", saved.c_str(), 1);
    else
      unsetenv("QUINTET_GROUPED_GEMM");
    throw;
  }
  if (old != nullptr)
    setenv("QUINTET_GROUPED_GEMM", saved.c_str(), 1);
  else
    unsetenv("QUINTET_GROUPED_GEMM");
}

// Checks one grouped kernel's result (what fn returns, run once after `reset` when set; `kernel`
// names it) against the loop's into diff, then times fn into ms. reset undoes what earlier calls
// left in a result fn accumulates into (dw += ...), which the timing's calls change again.
void check_and_time_kernel(const Setup& c, const Result& r, const char* kernel,
                           const std::vector<float>& ref, const std::function<Tensor()>& fn,
                           const std::function<void()>& reset, double tolerance, double& diff,
                           double& ms) {
  if (reset) reset();
  const Tensor got = fn();
  c.s.synchronize();
  diff = max_rel_diff(ref, got);
  if (!(diff <= tolerance)) {
    throw std::runtime_error("experts: " + r.product + ": the " + kernel +
                             "'s result differs from the loop's: max |diff| / max |loop| = " +
                             std::to_string(diff) + " > " + std::to_string(tolerance));
  }
  ms = median_ms(c.s, kWarmup, c.opt.iters, [&] { fn(); });
}

// Our grouped kernels (the mma.sync one, and on sm_90 the wgmma one), each checked against the
// loop's result (after `reset`, when set), then timed.
void verify_and_time_kernel(const Setup& c, Result& r, const std::vector<float>& ref,
                            const std::function<Tensor()>& fn, double tolerance,
                            const std::function<void()>& reset = nullptr) {
  with_grouped_gemm("kernel", [&] {
    check_and_time_kernel(c, r, "grouped kernel", ref, fn, reset, tolerance, r.kernel_diff,
                          r.kernel_ms);
  });
  if (!c.hopper) return;
  with_grouped_gemm("wgmma", [&] {
    check_and_time_kernel(c, r, "wgmma kernel", ref, fn, reset, tolerance, r.wgmma_diff,
                          r.wgmma_ms);
  });
}

// forward or backward_input: a bf16 [T, cols] result, rows of expert e at its offset.
Result bench_rows_product(const Setup& c, Pass pass, const Layer& l) {
  const Stream& s = c.s;
  const Device gpu = s.device();
  const std::int64_t cols = pass == Pass::forward ? l.out : l.in;
  const Tensor ref = Tensor::zeros({c.total, cols}, DType::bf16, gpu);
  const Tensor got = Tensor::zeros({c.total, cols}, DType::bf16, gpu);
  Stream::default_stream(gpu).synchronize();
  // What the layer runs per expert; the op allocates its result.
  const auto op = [&](std::int64_t e, std::int64_t off, std::int64_t n) {
    return pass == Pass::forward
               ? nn::linear_forward(l.x.narrow(0, off, n), l.w.select(e), Tensor(), s)
               : nn::linear_backward_input(l.dy.narrow(0, off, n), l.w.select(e), s);
  };
  c.for_each_expert([&](std::int64_t e, std::int64_t off, std::int64_t n) {
    ref.narrow(0, off, n).copy_(op(e, off, n), s);
  });
  s.synchronize();
  const std::vector<float> ref_host = ref.to_vector<float>();

  Result r;
  r.product = std::string(l.name) + "_" + pass_name(pass);
  r.grouped_path = "bf16 C";
  r.out_dtype = "bf16";
  GroupedGemm g(expert_problems(c, pass, l, got), CUDA_R_16BF, CUDA_R_16BF, 0.0f, c.grouping);
  verify_and_time(c, r, g, ref_host, got, {got}, nullptr, kBf16Tolerance);
  r.loop_ms = median_ms(s, kWarmup, c.opt.iters, [&] {
    c.for_each_expert([&](std::int64_t e, std::int64_t off, std::int64_t n) { op(e, off, n); });
  });
  // The grouped kernel, as the layer runs it without host counts (the op allocates its result).
  const std::span<const std::int64_t> no_host;
  verify_and_time_kernel(
      c, r, ref_host,
      [&] {
        return pass == Pass::forward
                   ? nn::grouped_linear_forward(l.x, l.w, c.device_offsets, no_host, s)
                   : nn::grouped_linear_backward_input(l.dy, l.w, c.device_offsets, no_host, s);
      },
      kBf16Tolerance);
  return r;
}

// backward_weight: dw [E, out, in] f32 += dyᵀ·x per expert. Two results: the product as
// training needs it (f32 dw), then the bf16-C GEMM alone accumulating in bf16 (not in the total).
void bench_weight_product(const Setup& c, const Layer& l, std::vector<Result>& results) {
  const Stream& s = c.s;
  const Device gpu = s.device();
  const cudaStream_t h = s.handle();
  const auto experts = static_cast<std::int64_t>(c.rows.size());
  const Shape shape = {experts, l.out, l.in};
  const Tensor dw_ref = Tensor::zeros(shape, DType::f32, gpu);
  const Tensor dw_loop = Tensor::zeros(shape, DType::f32, gpu);
  const Tensor dw_got = Tensor::zeros(shape, DType::f32, gpu);
  const Tensor scratch = Tensor::zeros(shape, DType::bf16, gpu);  // empty experts stay 0
  const Tensor dw_bf16 = Tensor::zeros(shape, DType::bf16, gpu);
  Stream::default_stream(gpu).synchronize();
  const auto loop = [&](const Tensor& dw) {
    c.for_each_expert([&](std::int64_t e, std::int64_t off, std::int64_t n) {
      nn::linear_backward_weight(l.dy.narrow(0, off, n), l.x.narrow(0, off, n), dw.select(e),
                                 Tensor(), s);
    });
  };
  loop(dw_ref);
  s.synchronize();
  const std::vector<float> ref_host = dw_ref.to_vector<float>();
  const std::string product = std::string(l.name) + "_backward_weight";
  const double loop_ms = median_ms(s, kWarmup, c.opt.iters, [&] { loop(dw_loop); });

  // bf16 A/B with an f32 C is not in cuBLAS's list for the grouped call (grouped_gemm.hpp); it is
  // tried anyway so that a cuBLAS which adds it gets measured.
  Result r;
  r.product = product;
  r.out_dtype = "f32";
  r.loop_ms = loop_ms;
  GroupedGemm native(expert_problems(c, Pass::backward_weight, l, dw_got), CUDA_R_16BF, CUDA_R_32F,
                     1.0f, c.grouping);
  const cublasStatus_t status = native.try_run(h);
  s.synchronize();
  r.f32_c_status = cublasGetStatusName(status);
  if (status == CUBLAS_STATUS_SUCCESS) {
    r.grouped_path = "f32 C, beta 1";
    verify_and_time(c, r, native, ref_host, dw_got, {dw_got}, nullptr, kF32Tolerance);
  } else {
    // The nearest thing cuBLAS has: the product in bf16, then added into the f32 dw.
    r.grouped_path = "bf16 C (beta 0) into a scratch, then nn::add_ into the f32 dw";
    GroupedGemm via_bf16(expert_problems(c, Pass::backward_weight, l, scratch), CUDA_R_16BF,
                         CUDA_R_16BF, 0.0f, c.grouping);
    verify_and_time(
        c, r, via_bf16, ref_host, dw_got, {dw_got, scratch},
        [&] { nn::add_(dw_got, scratch, 1.0f, s); }, kBf16Tolerance);
  }
  // The op accumulates (dw +=) and the wgmma kernel's check follows the mma.sync kernel's timed
  // calls: dw from zero before each check.
  const Tensor dw_kernel = Tensor::zeros(shape, DType::f32, gpu);
  Stream::default_stream(gpu).synchronize();
  verify_and_time_kernel(
      c, r, ref_host,
      [&] {
        nn::grouped_linear_backward_weight(l.dy, l.x, c.device_offsets, dw_kernel,
                                           std::span<const std::int64_t>(), s);
        return dw_kernel;
      },
      kF32Tolerance, [&] { Tensor(dw_kernel).fill_(0.0, s); });  // a handle: zeroes dw_kernel
  results.push_back(r);

  Result b;
  b.product = product + "_bf16acc";
  b.grouped_path = "bf16 C, beta 1 (the GEMM alone; dw accumulated in bf16)";
  b.out_dtype = "bf16";
  b.in_total = false;
  b.loop_ms = loop_ms;
  b.f32_c_status = r.f32_c_status;
  GroupedGemm bf16acc(expert_problems(c, Pass::backward_weight, l, dw_bf16), CUDA_R_16BF,
                      CUDA_R_16BF, 1.0f, c.grouping);
  verify_and_time(c, b, bf16acc, ref_host, dw_bf16, {dw_bf16}, nullptr, kBf16Tolerance);
  results.push_back(b);
}

double tflops(double flops, double ms) { return flops / ms * 1e-9; }

std::string rows_summary(const std::vector<std::int64_t>& rows) {
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  const auto empty = std::count(rows.begin(), rows.end(), std::int64_t{0});
  if (*lo == *hi) return std::to_string(*lo) + " each";
  std::string s;
  if (rows.size() <= 16) {
    for (const std::int64_t r : rows) {
      if (!s.empty()) s += ' ';
      s += std::to_string(r);
    }
  } else {
    s = std::to_string(*lo) + ".." + std::to_string(*hi);
  }
  return s + ", " + std::to_string(empty) + " empty";
}

void print(const Setup& c, const std::vector<Result>& results) {
  const ExpertBenchOptions& opt = c.opt;
  const auto experts = static_cast<std::int64_t>(c.rows.size());
  Result total;
  total.product = "total";
  for (const Result& r : results) {
    if (!r.in_total) continue;
    total.flops += r.flops;
    total.loop_ms += r.loop_ms;
    total.grouped_ms += r.grouped_ms;
    total.upload_ms += r.upload_ms;
    total.kernel_ms += r.kernel_ms;
    total.wgmma_ms += r.wgmma_ms;
  }
  if (!opt.json) {
    std::printf(
        "\nexperts: %lld experts, hidden %lld, ffn %lld, %lld rows (%s), bf16 in, f32 "
        "accumulation (dw f32)\n",
        static_cast<long long>(experts), static_cast<long long>(opt.hidden),
        static_cast<long long>(opt.ffn), static_cast<long long>(c.total),
        rows_summary(c.rows).c_str());
    std::printf(
        "loop = quintet::nn::linear_* per expert (cuBLASLt); grouped = one "
        "cublasGemmGroupedBatchedEx per product (groups by %s), pointer arrays on the device; "
        "+upload = after an H2D copy of them; kernel = our grouped kernel "
        "(nn::grouped_linear_*, offsets on the device, one launch; mma.sync); wgmma = the same "
        "with QUINTET_GROUPED_GEMM=wgmma (sm_90 only, else 0); ms = median of %d; ratio = "
        "TF/s / loop TF/s\n",
        opt.grouping.c_str(), opt.iters);
    std::printf("%-30s %6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %7s %7s %7s %7s\n", "product",
                "groups", "loop ms", "grouped", "+upload", "kernel", "wgmma", "loop TF/s",
                "grouped", "+upload", "kernel", "wgmma", "ratio", "+upload", "kernel", "wgmma");
  }
  const auto line = [&](const Result& r) {
    const double tl = tflops(r.flops, r.loop_ms), tg = tflops(r.flops, r.grouped_ms),
                 tu = tflops(r.flops, r.upload_ms);
    // The bf16-accumulation row has no kernel counterpart.
    const double tk = r.kernel_ms > 0.0 ? tflops(r.flops, r.kernel_ms) : 0.0;
    const double tw = r.wgmma_ms > 0.0 ? tflops(r.flops, r.wgmma_ms) : 0.0;
    if (opt.json) {
      nlohmann::json j{{"bench", "experts"},
                       {"product", r.product},
                       {"dtype", "bf16"},
                       {"experts", experts},
                       {"hidden", opt.hidden},
                       {"ffn", opt.ffn},
                       {"rows_total", c.total},
                       {"expert_rows", c.rows},
                       {"skew", opt.skew},
                       {"grouping", opt.grouping},
                       {"iters", opt.iters},
                       {"in_total", r.in_total},
                       {"gflop", r.flops * 1e-9},
                       {"loop_ms", r.loop_ms},
                       {"grouped_ms", r.grouped_ms},
                       {"grouped_upload_ms", r.upload_ms},
                       {"loop_tflops", tl},
                       {"grouped_tflops", tg},
                       {"grouped_upload_tflops", tu},
                       {"ratio", tg / tl},
                       {"ratio_upload", tu / tl},
                       {"kernel_ms", r.kernel_ms},
                       {"kernel_tflops", tk},
                       {"kernel_ratio", tk / tl},
                       {"wgmma_ms", r.wgmma_ms},
                       {"wgmma_tflops", tw},
                       {"wgmma_ratio", tw / tl}};
      if (r.product != "total") {
        j["groups"] = r.groups;
        j["problems"] = r.problems;
        j["out_dtype"] = r.out_dtype;
        j["grouped_path"] = r.grouped_path;
        j["max_rel_diff"] = r.diff;
        j["max_rel_diff_upload"] = r.diff_upload;
        j["kernel_max_rel_diff"] = r.kernel_diff;
        j["wgmma_max_rel_diff"] = r.wgmma_diff;
        j["tolerance"] = r.tolerance;
      }
      if (!r.f32_c_status.empty()) {
        j["f32_c_status"] = r.f32_c_status;
        j["f32_c_supported"] = r.f32_c_status == "CUBLAS_STATUS_SUCCESS";
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      const std::string groups = r.product == "total" ? "" : std::to_string(r.groups);
      std::printf(
          "%-30s %6s %9.3f %9.3f %9.3f %9.3f %9.3f %9.1f %9.1f %9.1f %9.1f %9.1f %7.3f %7.3f %7.3f "
          "%7.3f\n",
          r.product.c_str(), groups.c_str(), r.loop_ms, r.grouped_ms, r.upload_ms, r.kernel_ms,
          r.wgmma_ms, tl, tg, tu, tk, tw, tg / tl, tu / tl, tk / tl, tw / tl);
    }
  };
  for (const Result& r : results) {
    if (r.in_total) line(r);
  }
  line(total);
  for (const Result& r : results) {
    if (!r.in_total) line(r);
  }
  if (!opt.json) {
    for (const Result& r : results) {
      if (r.in_total && !r.f32_c_status.empty()) {
        std::printf("%s: bf16 A/B with an f32 C -> %s; grouped = %s\n", r.product.c_str(),
                    r.f32_c_status.c_str(), r.grouped_path.c_str());
      }
    }
    std::printf("*_bf16acc: %s; not in the total\n",
                "the grouped bf16-C GEMM alone, dw accumulated in bf16 (beta 1)");
  }
  std::fflush(stdout);
}

// ---- FP8: the grouped FP8 ops (nn::grouped_fp8_linear_*, offsets on the device) against a loop
// of nn::fp8_gemm per expert (cuBLASLt's FP8 matmul), beside the bf16 kernel ----

// An operand cast whole (E4M3 or E5M2) at the scale of its amax, with its transpose.
nn::Fp8Tensor cast_whole(const Tensor& t, nn::Fp8Format format, const Stream& s) {
  const float scale =
      nn::fp8_scale_from_amax(nn::fp8_amax(t, s), format, 0, 1.0f, "09_op_bench operand");
  return nn::fp8_cast(t, nn::fp8_scale_tensor(scale, s.device(), s), format, true, Tensor(), s);
}
nn::Fp8Tensor part(const Tensor& data, const nn::Fp8Tensor& q) {
  return {data, Tensor(), q.scale, q.format};
}

void bench_experts_fp8(const Setup& c, const Layer& fc, const Layer& proj,
                       const std::vector<Result>& bf16) {
  const Stream& s = c.s;
  const std::span<const std::int64_t> no_host;
  struct Fp8Result {
    std::string product;
    double flops = 0.0, loop_ms = 0.0, kernel_ms = 0.0, bf16_kernel_ms = 0.0, diff = 0.0;
    // QUINTET_GROUPED_GEMM=wgmma (the Hopper FP8 kernel; sm_90 only, else 0), and the bf16
    // wgmma kernel's time for the product.
    double wgmma_ms = 0.0, wgmma_diff = 0.0, bf16_wgmma_ms = 0.0;
  };
  std::vector<Fp8Result> results;
  for (const Layer* l : {&fc, &proj}) {
    const nn::Fp8Tensor qx = cast_whole(l->x, nn::Fp8Format::e4m3, s);
    const nn::Fp8Tensor qw = cast_whole(l->w, nn::Fp8Format::e4m3, s);
    const nn::Fp8Tensor qdy = cast_whole(l->dy, nn::Fp8Format::e5m2, s);
    // What the per-expert casts gave the loop: each expert's transposes, contiguous.
    std::vector<Tensor> w_t, x_t, dy_t;
    for (std::size_t e = 0; e < c.rows.size(); ++e) {
      const auto ei = static_cast<std::int64_t>(e);
      w_t.push_back(qw.transposed.narrow(1, ei * l->out, l->out).contiguous(s));
      x_t.push_back(qx.transposed.narrow(1, c.offsets[e], c.rows[e]).contiguous(s));
      dy_t.push_back(qdy.transposed.narrow(1, c.offsets[e], c.rows[e]).contiguous(s));
    }
    const Tensor wt_only = qw.transposed;
    for (const Pass pass : {Pass::forward, Pass::backward_input, Pass::backward_weight}) {
      Fp8Result r;
      r.product = std::string(l->name) + "_" + pass_name(pass);
      const std::int64_t cols = pass == Pass::forward ? l->out : l->in;
      r.flops = 2.0 * static_cast<double>(c.total) * static_cast<double>(l->in * l->out);
      for (const Result& b : bf16) {
        if (b.product == r.product) {
          r.bf16_kernel_ms = b.kernel_ms;
          r.bf16_wgmma_ms = b.wgmma_ms;
        }
      }
      const bool weight = pass == Pass::backward_weight;
      const Shape out_shape = weight
                                  ? Shape{static_cast<std::int64_t>(c.rows.size()), l->out, l->in}
                                  : Shape{c.total, cols};
      const Tensor loop_out =
          Tensor::zeros(out_shape, weight ? DType::f32 : DType::bf16, s.device());
      const Tensor dw = Tensor::zeros(out_shape, DType::f32, s.device());
      Stream::default_stream(s.device()).synchronize();
      const std::function<void()> loop = [&] {
        c.for_each_expert([&](std::int64_t e, std::int64_t off, std::int64_t n) {
          const auto i = static_cast<std::size_t>(e);
          if (pass == Pass::forward) {
            nn::fp8_gemm(part(qx.data.narrow(0, off, n), qx), part(qw.data.select(e), qw), Tensor(),
                         loop_out.narrow(0, off, n), false, true, s);
          } else if (pass == Pass::backward_input) {
            nn::fp8_gemm(part(qdy.data.narrow(0, off, n), qdy), part(w_t[i], qw), Tensor(),
                         loop_out.narrow(0, off, n), false, false, s);
          } else {
            nn::fp8_gemm(part(dy_t[i], qdy), part(x_t[i], qx), Tensor(), loop_out.select(e), true,
                         false, s);
          }
        });
      };
      const std::function<Tensor()> kernel = [&] {
        if (pass == Pass::forward) {
          return nn::grouped_fp8_linear_forward(qx, qw, c.device_offsets, no_host, DType::bf16,
                                                true, s);
        }
        if (pass == Pass::backward_input) {
          return nn::grouped_fp8_linear_backward_input(qdy,
                                                       {Tensor(), wt_only, qw.scale, qw.format},
                                                       c.device_offsets, no_host, DType::bf16, s);
        }
        nn::grouped_fp8_linear_backward_weight(qdy, qx, c.device_offsets, dw, no_host, s);
        return dw;
      };
      loop();
      s.synchronize();
      const std::vector<float> ref =
          loop_out.to(DType::f32, s).to(Device::cpu(), s).to_vector<float>();
      const double tolerance = weight ? kF32Tolerance * 5 : kBf16Tolerance;
      // One kernel's result (dw from zero) against the loop's, then its time.
      const auto check_and_time = [&](const char* kernel_name, double& diff, double& ms) {
        Tensor(dw).fill_(0.0, s);  // a handle: zeroes dw
        const Tensor got = kernel();
        s.synchronize();
        diff = max_rel_diff(ref, got.to(DType::f32, s).to(Device::cpu(), s));
        if (!(diff <= tolerance)) {
          throw std::runtime_error("experts fp8: " + r.product + ": the " + kernel_name +
                                   "'s result differs from the loop's: " + std::to_string(diff) +
                                   " > " + std::to_string(tolerance));
        }
        ms = median_ms(s, kWarmup, c.opt.iters, [&] { kernel(); });
      };
      with_grouped_gemm("kernel",
                        [&] { check_and_time("grouped FP8 kernel", r.diff, r.kernel_ms); });
      if (c.hopper) {
        with_grouped_gemm("wgmma",
                          [&] { check_and_time("FP8 wgmma kernel", r.wgmma_diff, r.wgmma_ms); });
      }
      r.loop_ms = median_ms(s, kWarmup, c.opt.iters, loop);
      results.push_back(r);
    }
  }
  if (!c.opt.json) {
    std::printf(
        "\nexperts fp8: the same products in FP8 (x, w E4M3; dy E5M2; cast whole, one scale each), "
        "bf16 out, dw f32; loop = nn::fp8_gemm per expert (cuBLASLt FP8); kernel = "
        "nn::grouped_fp8_linear_* (offsets on the device, one launch; mma.sync); wgmma = the "
        "same with QUINTET_GROUPED_GEMM=wgmma (sm_90 only, else 0); bf16, bf16 wg = the bf16 "
        "kernel and wgmma kernel above\n");
    std::printf("%-30s %9s %9s %9s %9s %9s %9s %9s %9s %7s %7s %7s\n", "product", "loop ms",
                "kernel", "wgmma", "bf16", "bf16 wg", "loop TF/s", "kernel", "wgmma", "k/loop",
                "w/loop", "w/bf16wg");
  }
  for (const Fp8Result& r : results) {
    const double tl = tflops(r.flops, r.loop_ms), tk = tflops(r.flops, r.kernel_ms),
                 tb = r.bf16_kernel_ms > 0.0 ? tflops(r.flops, r.bf16_kernel_ms) : 0.0,
                 tw = r.wgmma_ms > 0.0 ? tflops(r.flops, r.wgmma_ms) : 0.0,
                 tbw = r.bf16_wgmma_ms > 0.0 ? tflops(r.flops, r.bf16_wgmma_ms) : 0.0;
    if (c.opt.json) {
      nlohmann::json j{{"bench", "experts_fp8"},
                       {"product", r.product},
                       {"rows_total", c.total},
                       {"expert_rows", c.rows},
                       {"skew", c.opt.skew},
                       {"gflop", r.flops * 1e-9},
                       {"loop_ms", r.loop_ms},
                       {"kernel_ms", r.kernel_ms},
                       {"bf16_kernel_ms", r.bf16_kernel_ms},
                       {"loop_tflops", tl},
                       {"kernel_tflops", tk},
                       {"bf16_kernel_tflops", tb},
                       {"wgmma_ms", r.wgmma_ms},
                       {"wgmma_tflops", tw},
                       {"bf16_wgmma_ms", r.bf16_wgmma_ms},
                       {"bf16_wgmma_tflops", tbw},
                       {"max_rel_diff", r.diff}};
      if (r.wgmma_ms > 0.0) j["wgmma_max_rel_diff"] = r.wgmma_diff;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-30s %9.3f %9.3f %9.3f %9.3f %9.3f %9.1f %9.1f %9.1f %7.3f %7.3f %7.3f\n",
                  r.product.c_str(), r.loop_ms, r.kernel_ms, r.wgmma_ms, r.bf16_kernel_ms,
                  r.bf16_wgmma_ms, tl, tk, tw, tk / tl, tw / tl, tbw > 0.0 ? tw / tbw : 0.0);
    }
  }
  std::fflush(stdout);
}

}  // namespace

std::vector<std::int64_t> expert_rows(const ExpertBenchOptions& opt) {
  std::vector<std::int64_t> rows = opt.rows;
  if (rows.empty()) {
    if (opt.experts < 1 || opt.tokens < 1 || opt.top_k < 1) {
      throw std::invalid_argument("experts: experts, tokens and top-k must be positive");
    }
    if (!(opt.skew >= 0.0) || !std::isfinite(opt.skew)) {
      throw std::invalid_argument("experts: --expert-skew must be a finite number >= 0");
    }
    const int n = opt.experts;
    const std::int64_t total = opt.tokens * opt.top_k;
    std::vector<double> weight(n, 1.0);
    if (n > 1) {
      for (int e = 0; e < n; ++e) {
        weight[e] = std::max(0.0, 1.0 + opt.skew * (2.0 * e - (n - 1)) / (n - 1));
      }
    }
    const double sum = std::accumulate(weight.begin(), weight.end(), 0.0);  // >= 1: the last
    rows.resize(n);
    std::vector<double> frac(n);
    std::int64_t given = 0;
    for (int e = 0; e < n; ++e) {
      const double exact = static_cast<double>(total) * weight[e] / sum;
      rows[e] = static_cast<std::int64_t>(std::floor(exact));
      frac[e] = exact - static_cast<double>(rows[e]);
      given += rows[e];
    }
    // The remainder one row each to the largest fractions (the total unchanged).
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac[a] > frac[b]; });
    for (std::int64_t i = 0; given < total; ++i, ++given) ++rows[order[i % n]];
    for (; given > total; --given) --*std::max_element(rows.begin(), rows.end());
  }
  std::int64_t total = 0;
  for (const std::int64_t r : rows) {
    if (r < 0) throw std::invalid_argument("experts: a row count is negative");
    total += r;
  }
  if (total == 0) throw std::invalid_argument("experts: no expert has a row");
  return rows;
}

void bench_experts(const ExpertBenchOptions& opt, const Stream& s) {
  if (opt.grouping != "shape" && opt.grouping != "expert") {
    throw std::invalid_argument("experts: grouping must be 'shape' or 'expert', got '" +
                                opt.grouping + "'");
  }
  Setup c{opt, s, expert_rows(opt),
          {},  0, opt.grouping == "expert" ? Grouping::per_problem : Grouping::by_shape};
  for (const std::int64_t r : c.rows) {
    c.offsets.push_back(c.total);
    c.total += r;
  }
  const Device gpu = s.device();
  std::vector<std::int64_t> bounds = c.offsets;
  bounds.push_back(c.total);
  c.device_offsets =
      Tensor::from_vector(bounds, {static_cast<std::int64_t>(bounds.size())}).to(gpu);
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    throw std::runtime_error("experts: cannot read the GPU's compute capability");
  }
  c.hopper = major == 9 && minor == 0;
  const std::int64_t experts = static_cast<std::int64_t>(c.rows.size()), d = opt.hidden,
                     f = opt.ffn;
  std::uint64_t seed = 900;
  const Tensor x = Tensor::randn({c.total, d}, ++seed, DType::bf16, gpu);   // fc's input
  const Tensor h = Tensor::randn({c.total, f}, ++seed, DType::bf16, gpu);   // proj's input
  const Tensor dh = Tensor::randn({c.total, f}, ++seed, DType::bf16, gpu);  // d fc output
  const Tensor dy = Tensor::randn({c.total, d}, ++seed, DType::bf16, gpu);  // d proj output
  const Tensor w1 = Tensor::randn({experts, f, d}, ++seed, DType::bf16, gpu);
  const Tensor w2 = Tensor::randn({experts, d, f}, ++seed, DType::bf16, gpu);
  Stream::default_stream(gpu).synchronize();  // inputs were drawn on the default stream
  const Layer fc{"fc", d, f, w1, x, dh}, proj{"proj", f, d, w2, h, dy};

  std::vector<Result> results;
  results.push_back(bench_rows_product(c, Pass::forward, fc));
  results.push_back(bench_rows_product(c, Pass::forward, proj));
  results.push_back(bench_rows_product(c, Pass::backward_input, proj));
  results.push_back(bench_rows_product(c, Pass::backward_input, fc));
  bench_weight_product(c, proj, results);
  bench_weight_product(c, fc, results);
  print(c, results);
  bench_experts_fp8(c, fc, proj, results);
}
