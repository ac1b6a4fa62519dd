// The FP8 ops' argument checks and dispatch, and per-tensor scaling (quintet/nn/fp8.hpp). The
// kernels: lib/nn/cpu/fp8.cpp and lib/nn/cuda/fp8.cu.
#include "quintet/nn/fp8.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>

#include "nn/cpu/cpu_ops.hpp"
#include "nn/op_checks.hpp"
#include "quintet/core/error.hpp"

namespace quintet::nn {

using detail::check_scale_tensor;
using detail::OpChecker;

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::e4m3 ? "e4m3" : "e5m2";
}

namespace {
void check_castable(const OpChecker& c, const char* name, const Tensor& x) {
  c.on_device(name, x);
  QUINTET_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                "{}: {} has dtype {}, expected f32 or bf16", c.op(), name, dtype_name(x.dtype()));
}
void check_scale(const OpChecker& c, float scale) {
  QUINTET_CHECK(std::isfinite(scale) && scale > 0.0f, "{}: scale = {} must be a finite number > 0",
                c.op(), scale);
}
void check_amax_tensor(const OpChecker& c, const Tensor& t) {
  c.on_device("amax", t);
  QUINTET_CHECK(t.dtype() == DType::f32 && t.numel() == 1 && t.is_contiguous(),
                "{}: amax is {} {}, expected one contiguous f32 value", c.op(),
                dtype_name(t.dtype()), shape_str(t.shape()));
}
// An FP8 operand of the GEMM: u8 [rows, k], contiguous, with its scale tensor.
void check_operand(const OpChecker& c, const char* name, const Fp8Tensor& q) {
  c.on_device(name, q.data);
  QUINTET_CHECK(q.data.dtype() == DType::u8 && q.data.dim() == 2 && q.data.is_contiguous(),
                "{}: {} is {} {}, expected a contiguous u8 [rows, k] FP8 tensor", c.op(), name,
                dtype_name(q.data.dtype()), shape_str(q.data.shape()));
  check_scale_tensor(c, name, q.scale);
}
}  // namespace

float fp8_amax(const Tensor& x, const Stream& stream) {
  const OpChecker c("fp8_amax", stream);
  check_castable(c, "x", x);
  if (!c.on_cuda()) return cpu_ops::fp8_amax(x.contiguous(stream));
  Tensor amax = Tensor::empty({1}, DType::f32, c.device(), stream);
  amax.fill_(0.0, stream);
  fp8_amax_into(x, amax, stream);
  const Tensor host = amax.to(Device::cpu(), stream);
  stream.synchronize();
  return host.data<float>()[0];
}

Tensor fp8_quantize(const Tensor& x, float scale, Fp8Format format, const Stream& stream) {
  const OpChecker c("fp8_quantize", stream);
  check_castable(c, "x", x);
  check_scale(c, scale);
  return fp8_cast(x, fp8_scale_tensor(scale, c.device(), stream), format, false, Tensor(), stream)
      .data;
}

Tensor fp8_dequantize(const Tensor& q, float scale, Fp8Format format, DType out,
                      const Stream& stream) {
  const OpChecker c("fp8_dequantize", stream);
  check_scale(c, scale);
  return fp8_dequantize(Fp8Tensor{q, Tensor(), fp8_scale_tensor(scale, c.device(), stream), format},
                        out, stream);
}

Tensor fp8_round_trip(const Tensor& x, float scale, Fp8Format format, const Stream& stream) {
  return fp8_dequantize(fp8_quantize(x, scale, format, stream), scale, format, x.dtype(), stream);
}

Tensor fp8_scale_tensor(float scale, const Device& device, const Stream& stream) {
  const OpChecker c("fp8_scale_tensor", stream);
  check_scale(c, scale);
  QUINTET_CHECK(device == c.device(), "fp8_scale_tensor: device {} but the stream is on {}",
                device.str(), c.device().str());
  if (!c.on_cuda()) return Tensor::from_vector<float>({1.0f / scale, scale}, {2});
  // Two fills on the stream (a copy from pageable host memory would wait for it); float to
  // double and back is exact.
  Tensor t = Tensor::empty({2}, DType::f32, device, stream);
  t.narrow(0, 0, 1).fill_(1.0f / scale, stream);
  t.narrow(0, 1, 1).fill_(scale, stream);
  return t;
}

void fp8_amax_into(const Tensor& x, const Tensor& amax, const Stream& stream) {
  fp8_amaxes_into({x}, amax, stream);
}

void fp8_amaxes_into(const std::vector<Tensor>& xs, const Tensor& amax, const Stream& stream) {
  const OpChecker c("fp8_amaxes_into", stream);
  for (const Tensor& x : xs) check_castable(c, "x", x);
  c.on_device("amax", amax);
  QUINTET_CHECK(amax.dtype() == DType::f32 && amax.dim() == 1 &&
                    amax.numel() == static_cast<std::int64_t>(xs.size()) && amax.is_contiguous(),
                "{}: amax is {} {}, expected a contiguous f32 [{}] (one per tensor)", c.op(),
                dtype_name(amax.dtype()), shape_str(amax.shape()), xs.size());
  std::vector<Tensor> xc;
  for (const Tensor& x : xs) xc.push_back(x.contiguous(stream));
#if QUINTET_NN_HAS_CUDA_OPS
  if (c.on_cuda()) {
    const DeviceGuard guard(c.device());
    cuda_ops::fp8_amaxes(xc, amax, stream);
    return;
  }
#endif
  for (std::size_t i = 0; i < xc.size(); ++i) {
    cpu_ops::fp8_cast(xc[i], Tensor(), Fp8Format::e4m3, Tensor(), Tensor(),
                      amax.narrow(0, static_cast<std::int64_t>(i), 1));
  }
}

namespace {
// fp8_cast's checks of one cast and its outputs, allocated; xc: x made contiguous.
Fp8Tensor cast_outputs(const OpChecker& c, const Fp8CastArgs& a, Tensor& xc, const Stream& stream) {
  const Tensor& x = a.x;
  check_castable(c, "x", x);
  check_scale_tensor(c, "scale", a.scale);
  if (a.amax.defined()) check_amax_tensor(c, a.amax);
  QUINTET_CHECK(!a.transposed || x.dim() >= 1, "{}: a transposed copy of a 0-dimensional tensor",
                c.op());
  xc = x.contiguous(stream);
  Fp8Tensor q;
  q.format = a.format;
  q.scale = a.scale;
  q.data = Tensor::empty(x.shape(), DType::u8, c.device(), stream);
  if (a.transposed) {
    const std::int64_t cols = x.size(x.dim() - 1), rows = cols == 0 ? 0 : x.numel() / cols;
    q.transposed = Tensor::empty({cols, rows}, DType::u8, c.device(), stream);
  }
  return q;
}
}  // namespace

Fp8Tensor fp8_cast(const Tensor& x, const Tensor& scale_t, Fp8Format format, bool transposed,
                   const Tensor& amax, const Stream& stream) {
  const OpChecker c("fp8_cast", stream);
  Tensor xc;
  Fp8Tensor q = cast_outputs(c, {x, scale_t, format, transposed, amax}, xc, stream);
  QUINTET_NN_DISPATCH(c, stream, fp8_cast, xc, scale_t, format, q.data, q.transposed, amax);
  return q;
}

std::vector<Fp8Tensor> fp8_casts(const std::vector<Fp8CastArgs>& casts, const Stream& stream) {
  const OpChecker c("fp8_casts", stream);
  std::vector<Tensor> xc(casts.size());
  std::vector<Fp8Tensor> q;
  for (std::size_t i = 0; i < casts.size(); ++i) {
    q.push_back(cast_outputs(c, casts[i], xc[i], stream));
  }
#if QUINTET_NN_HAS_CUDA_OPS
  if (c.on_cuda()) {
    const DeviceGuard guard(c.device());
    std::vector<cuda_ops::Fp8CastJob> jobs;
    for (std::size_t i = 0; i < casts.size(); ++i) {
      jobs.push_back(
          {xc[i], casts[i].scale, casts[i].format, q[i].data, q[i].transposed, casts[i].amax});
    }
    cuda_ops::fp8_casts(jobs, stream);
    return q;
  }
#endif
  for (std::size_t i = 0; i < casts.size(); ++i) {
    cpu_ops::fp8_cast(xc[i], casts[i].scale, casts[i].format, q[i].data, q[i].transposed,
                      casts[i].amax);
  }
  return q;
}

Tensor fp8_dequantize(const Fp8Tensor& q, DType out, const Stream& stream) {
  const OpChecker c("fp8_dequantize", stream);
  c.on_device("q", q.data);
  QUINTET_CHECK(q.data.dtype() == DType::u8, "fp8_dequantize: q has dtype {}, expected u8",
                dtype_name(q.data.dtype()));
  QUINTET_CHECK(out == DType::f32 || out == DType::bf16,
                "fp8_dequantize: out = {}, expected f32 or bf16", dtype_name(out));
  check_scale_tensor(c, "scale", q.scale);
  Tensor x = Tensor::empty(q.data.shape(), out, c.device(), stream);
  const Tensor qc = q.data.contiguous(stream);
  QUINTET_NN_DISPATCH_ARGS(c, fp8_dequantize, (qc, q.scale.data<float>()[0], q.format, x),
                           (qc, q.scale, q.format, x, stream));
  return x;
}

void fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& bias, const Tensor& y,
              bool accumulate, bool fast_accum, const Stream& stream) {
  const OpChecker c("fp8_gemm", stream);
  check_operand(c, "a", a);
  check_operand(c, "b", b);
  const std::int64_t n = a.data.size(0), k = a.data.size(1), m = b.data.size(0);
  QUINTET_CHECK(b.data.size(1) == k, "fp8_gemm: a is {} and b is {}; expected [n, k] and [m, k]",
                shape_str(a.data.shape()), shape_str(b.data.shape()));
  QUINTET_CHECK(a.format == Fp8Format::e4m3 || b.format == Fp8Format::e4m3,
                "fp8_gemm: a and b are both E5M2; FP8 GEMMs take E4M3 by E4M3 or E5M2");
  const DType t = c.compute("y", y);
  QUINTET_CHECK(c.on_cuda() || t == DType::f32, "fp8_gemm: y has dtype {}; on the CPU, f32",
                dtype_name(t));
  c.shape("y", y, {n, m});
  QUINTET_CHECK(y.is_contiguous(), "fp8_gemm: y must be contiguous (it is written in place)");
  QUINTET_CHECK(!accumulate || t == DType::f32,
                "fp8_gemm: accumulate into y of dtype {}; accumulation is into f32", dtype_name(t));
  if (bias.defined()) {
    c.compute_as("bias", bias, t);
    c.shape("bias", bias, {m});
  }
  const Tensor bc = bias.defined() ? bias.contiguous(stream) : Tensor();
  QUINTET_NN_DISPATCH(c, stream, fp8_gemm, a.data, a.scale, a.format, b.data, b.scale, b.format, bc,
                      y, accumulate, fast_accum);
}

void fp8_column_sum(const Fp8Tensor& q, const Tensor& db, const Stream& stream) {
  const OpChecker c("fp8_column_sum", stream);
  c.on_device("q", q.data);
  QUINTET_CHECK(q.data.dtype() == DType::u8 && q.data.dim() >= 1,
                "fp8_column_sum: q is {} {}, expected a u8 [rows, cols] FP8 tensor",
                dtype_name(q.data.dtype()), shape_str(q.data.shape()));
  check_scale_tensor(c, "scale", q.scale);
  c.accumulator("db", db, DType::f32, {q.data.size(q.data.dim() - 1)});
  const Tensor qc = q.data.contiguous(stream);
  QUINTET_NN_DISPATCH(c, stream, fp8_column_sum, qc, q.scale, q.format, db);
}

// ---- scaling ---------------------------------------------------------------------------------

const char* fp8_scaling_name(Fp8Scaling scaling) {
  return scaling == Fp8Scaling::current ? "current" : "delayed";
}

Fp8Scaling parse_fp8_scaling(const std::string& name) {
  if (name == "current") return Fp8Scaling::current;
  if (name == "delayed") return Fp8Scaling::delayed;
  QUINTET_THROW(InvalidArgument, "FP8 scaling '{}': expected current or delayed", name);
}

const char* fp8_mode_name(Fp8Mode mode) { return mode == Fp8Mode::off ? "off" : "hybrid"; }

Fp8Mode parse_fp8_mode(const std::string& name) {
  if (name == "off") return Fp8Mode::off;
  if (name == "hybrid") return Fp8Mode::hybrid;
  QUINTET_THROW(InvalidArgument, "FP8 mode '{}': expected off or hybrid", name);
}

void check_fp8_recipe(const Fp8Recipe& recipe) {
  QUINTET_CHECK(recipe.amax_history >= 1, "Fp8Recipe: amax_history = {} must be >= 1",
                recipe.amax_history);
  QUINTET_CHECK(recipe.margin >= 0 && recipe.margin <= 64,
                "Fp8Recipe: margin = {} must be in [0, 64]", recipe.margin);
}

float fp8_scale_from_amax(float amax, Fp8Format format, int margin, float previous,
                          const std::string& what) {
  QUINTET_CHECK(std::isfinite(amax),
                "FP8 scaling of {}: its amax is {}; the tensor holds a non-finite value, which "
                "no FP8 scale represents",
                what, amax);
  QUINTET_CHECK(amax >= 0.0f, "FP8 scaling of {}: amax = {} is negative", what, amax);
  if (amax == 0.0f) return previous;
  const float scale = std::ldexp(fp8_max(format) / amax, -margin);
  return std::isfinite(scale) ? scale : FLT_MAX;
}

Fp8TensorScale::Fp8TensorScale(Fp8Format format, const Fp8Recipe& recipe, std::string what)
    : format_(format), recipe_(recipe), what_(std::move(what)) {
  check_fp8_recipe(recipe);
  if (recipe.scaling == Fp8Scaling::delayed)
    history_.assign(static_cast<std::size_t>(recipe.amax_history), 0.0f);
}

float Fp8TensorScale::scale(float amax, bool record) {
  // Checked here too for delayed scaling, whose scale does not depend on amax: a non-finite
  // tensor is refused at once, not one step later.
  const float now = fp8_scale_from_amax(amax, format_, recipe_.margin, 1.0f, what_);
  if (record) step_amax_ = std::max(step_amax_, amax);
  return uses_amax() ? now : scale_;
}

bool Fp8TensorScale::uses_amax() const {
  return recipe_.scaling == Fp8Scaling::current ||
         *std::max_element(history_.begin(), history_.end()) == 0.0f;
}

void Fp8TensorScale::end_step() {
  if (recipe_.scaling == Fp8Scaling::delayed) {
    std::rotate(history_.rbegin(), history_.rbegin() + 1, history_.rend());
    history_.front() = step_amax_;
    const float amax = *std::max_element(history_.begin(), history_.end());
    scale_ = fp8_scale_from_amax(amax, format_, recipe_.margin, scale_, what_);
  }
  step_amax_ = 0.0f;
}

const Tensor& Fp8TensorScale::device_state_on(const Device& device, const Stream& stream) {
  if (!device_.defined() || device_.device() != device) {
    known_scale_ = Tensor();
    // {scale_, step_amax_}, filled on the stream (the first use, or after set_state).
    device_ = Tensor::empty({2}, DType::f32, device, stream);
    device_.narrow(0, 0, 1).fill_(scale_, stream);
    device_.narrow(0, 1, 1).fill_(step_amax_, stream);
  }
  return device_;
}

Tensor Fp8TensorScale::scale_on_device(const Tensor& amax, bool record, const Stream& stream) {
  const OpChecker c("Fp8TensorScale::scale_on_device", stream);
  check_amax_tensor(c, amax);
  const Tensor& state = device_state_on(c.device(), stream);
  Tensor out = Tensor::empty({2}, DType::f32, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, fp8_scale, amax, state, out, format_, recipe_.margin, uses_amax(),
                      record);
  return out;
}

std::vector<Tensor> Fp8TensorScale::scales_on_device(const std::vector<Fp8TensorScale*>& scales,
                                                     const Tensor& amax, bool record,
                                                     const Stream& stream) {
  const OpChecker c("Fp8TensorScale::scales_on_device", stream);
  const auto n = static_cast<std::int64_t>(scales.size());
  if (amax.defined()) {
    c.on_device("amax", amax);
    QUINTET_CHECK(amax.dtype() == DType::f32 && amax.dim() == 1 && amax.numel() == n,
                  "{}: amax is {} {}, expected f32 [{}] (one per scale)", c.op(),
                  dtype_name(amax.dtype()), shape_str(amax.shape()), n);
  } else {
    QUINTET_CHECK(!record, "{}: record without an amax", c.op());
    for (const Fp8TensorScale* s : scales)
      QUINTET_CHECK(!s->uses_amax(), "{}: no amax for {}, whose scale comes from its amax", c.op(),
                    s->what());
  }
  for (std::size_t i = 0; i < scales.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      QUINTET_CHECK(scales[i] != scales[j], "{}: {} is given twice", c.op(), scales[i]->what());
  }
  // Without an amax, a scale's tensor is {1 / s, s} of the step's delayed scale: made once, then
  // returned until the state changes (end_device_step, set_state).
  std::vector<Tensor> out(scales.size());
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < scales.size(); ++i) {
    const Tensor& known = scales[i]->known_scale_;
    if (!amax.defined() && known.defined() && known.device() == c.device()) {
      out[i] = known;
    } else {
      todo.push_back(i);
    }
  }
  if (todo.empty()) return out;
#if QUINTET_NN_HAS_CUDA_OPS
  if (c.on_cuda()) {
    // One allocation, the scale tensors 4 floats (16 bytes) apart: cuBLASLt wants the inverse
    // scale's pointer 16-byte aligned (fp8_scale_tensor).
    const auto m = static_cast<std::int64_t>(todo.size());
    const Tensor all = Tensor::empty({4 * m}, DType::f32, c.device(), stream);
    std::vector<cuda_ops::Fp8ScaleArgs> args;
    for (std::int64_t k = 0; k < m; ++k) {
      const std::size_t i = todo[static_cast<std::size_t>(k)];
      Fp8TensorScale& s = *scales[i];
      out[i] = all.narrow(0, 4 * k, 2);
      args.push_back({amax.defined() ? amax.narrow(0, static_cast<std::int64_t>(i), 1) : Tensor(),
                      s.device_state_on(c.device(), stream), out[i], s.format_, s.recipe_.margin,
                      s.uses_amax()});
    }
    const DeviceGuard guard(c.device());
    cuda_ops::fp8_scales(args, record, stream);
  } else
#endif
  {
    for (const std::size_t i : todo) {
      // The CPU kernel reads an amax always: a scale that does not use it is given a zero.
      const Tensor a = amax.defined() ? amax.narrow(0, static_cast<std::int64_t>(i), 1)
                                      : Tensor::zeros({1}, DType::f32);
      out[i] = scales[i]->scale_on_device(a, record, stream);
    }
  }
  if (!amax.defined())
    for (const std::size_t i : todo) scales[i]->known_scale_ = out[i];
  return out;
}

void Fp8TensorScale::end_device_step(float step_amax, const Stream& stream) {
  fp8_scale_from_amax(step_amax, format_, recipe_.margin, 1.0f, what_);  // refuses a non-finite
  step_amax_ = step_amax;
  end_step();
  known_scale_ = Tensor();  // the next step's delayed scale
  if (device_.defined()) {
    device_.narrow(0, 0, 1).fill_(scale_, stream);
    device_.narrow(0, 1, 1).fill_(0.0, stream);
  }
}

void Fp8TensorScale::set_state(const std::vector<float>& history, float scale) {
  QUINTET_CHECK(history.size() == history_.size(),
                "FP8 scaling of {}: an amax history of {} values, expected {} (--fp8-amax-history)",
                what_, history.size(), history_.size());
  for (const float a : history)
    QUINTET_CHECK(std::isfinite(a) && a >= 0.0f,
                  "FP8 scaling of {}: amax history value {} must be finite and >= 0", what_, a);
  QUINTET_CHECK(std::isfinite(scale) && scale > 0.0f,
                "FP8 scaling of {}: scale {} must be finite and > 0", what_, scale);
  history_ = history;
  scale_ = scale;
  step_amax_ = 0.0f;
  device_ = Tensor();  // rebuilt from these values at the next scale_on_device
  known_scale_ = Tensor();
}

}  // namespace quintet::nn
