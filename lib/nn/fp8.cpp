// The FP8 casts' argument checks and dispatch, and per-tensor scaling (quintet/nn/fp8.hpp). The
// casts run on the CPU (lib/nn/cpu/fp8.cpp).
#include "quintet/nn/fp8.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>

#include "nn/cpu/cpu_ops.hpp"
#include "nn/op_checks.hpp"
#include "quintet/core/error.hpp"

namespace quintet::nn {

using detail::OpChecker;

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::e4m3 ? "e4m3" : "e5m2";
}

namespace {
// The FP8 casts have a CPU implementation only (the GPU path is cuBLASLt's, issue #45).
void cpu_only(const OpChecker& c) {
  QUINTET_CHECK(!c.on_cuda(), "{}: the FP8 casts run on the CPU only; {} is a GPU", c.op(),
                c.device().str());
}
void check_castable(const OpChecker& c, const char* name, const Tensor& x) {
  c.on_device(name, x);
  QUINTET_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                "{}: {} has dtype {}, expected f32 or bf16", c.op(), name, dtype_name(x.dtype()));
}
void check_scale(const OpChecker& c, float scale) {
  QUINTET_CHECK(std::isfinite(scale) && scale > 0.0f, "{}: scale = {} must be a finite number > 0",
                c.op(), scale);
}
}  // namespace

float fp8_amax(const Tensor& x, const Stream& stream) {
  const OpChecker c("fp8_amax", stream);
  cpu_only(c);
  check_castable(c, "x", x);
  return cpu_ops::fp8_amax(x.contiguous(stream));
}

Tensor fp8_quantize(const Tensor& x, float scale, Fp8Format format, const Stream& stream) {
  const OpChecker c("fp8_quantize", stream);
  cpu_only(c);
  check_castable(c, "x", x);
  check_scale(c, scale);
  Tensor q = Tensor::empty(x.shape(), DType::u8, c.device(), stream);
  cpu_ops::fp8_quantize(x.contiguous(stream), scale, format, q);
  return q;
}

Tensor fp8_dequantize(const Tensor& q, float scale, Fp8Format format, DType out,
                      const Stream& stream) {
  const OpChecker c("fp8_dequantize", stream);
  cpu_only(c);
  c.on_device("q", q);
  QUINTET_CHECK(q.dtype() == DType::u8, "fp8_dequantize: q has dtype {}, expected u8",
                dtype_name(q.dtype()));
  QUINTET_CHECK(out == DType::f32 || out == DType::bf16,
                "fp8_dequantize: out = {}, expected f32 or bf16", dtype_name(out));
  check_scale(c, scale);
  Tensor x = Tensor::empty(q.shape(), out, c.device(), stream);
  cpu_ops::fp8_dequantize(q.contiguous(stream), scale, format, x);
  return x;
}

Tensor fp8_round_trip(const Tensor& x, float scale, Fp8Format format, const Stream& stream) {
  return fp8_dequantize(fp8_quantize(x, scale, format, stream), scale, format, x.dtype(), stream);
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
}

}  // namespace quintet::nn
