// FP8 (OCP 8-bit floating point) casts and per-tensor scaling, for training the linear layers in
// FP8 ("hybrid" recipe: activations and weights in E4M3, output gradients in E5M2).
//
// Formats (OCP "OFP8" v1.0):
//   - E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448 (S.1111.110), no
//     infinity, NaN is S.1111.111; smallest subnormal 2^-9.
//   - E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; largest finite 57344 (S.11110.11),
//     IEEE-like infinity (S.11111.00) and NaN (S.11111.{01,10,11}); smallest subnormal 2^-16.
// An FP8 tensor is stored as u8 holding the bit patterns.
//
// Casting float -> FP8 (fp8_encode, fp8_quantize) rounds to nearest even and SATURATES: every
// value of magnitude >= the largest finite value, infinities included, becomes the signed largest
// finite value (as Transformer Engine's casts and PTX's cvt.rn.satfinite do; so an E5M2 result is
// never infinite). NaN becomes the canonical NaN 0x7F (S.1111.111 with S = 0) in both formats.
// Subnormals are produced and kept; -0 stays -0 (0x80).
//
// Scaling: a tensor x is quantised as q = fp8(x * scale) and dequantised as x' = float(q) *
// (1 / scale), the f32 reciprocal, as a GEMM's scale_inv epilogue applies it. The scale of a
// tensor comes from an amax (the largest |x|): scale = fp8_max / amax / 2^margin
// (fp8_scale_from_amax).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::nn {

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };

// "e4m3" / "e5m2".
const char* fp8_format_name(Fp8Format format);
// The largest finite value: 448 (E4M3) or 57344 (E5M2).
float fp8_max(Fp8Format format);

// One value: f rounded to nearest even and saturated as described above; its bit pattern.
std::uint8_t fp8_encode(float f, Fp8Format format);
// The value of a bit pattern (NaN for the NaN patterns, +-inf for E5M2's infinities).
float fp8_decode(std::uint8_t bits, Fp8Format format);

// ---- tensor casts with a host scale (CPU or GPU; on a GPU fp8_amax waits for the stream) -------
// The largest |x| of x (f32 or bf16, any shape; 0 for an empty tensor). NaN when x holds a NaN,
// inf when it holds an infinity (and no NaN): the scaling below refuses those.
float fp8_amax(const Tensor& x, const Stream& stream);
// q = fp8(x * scale), x f32 or bf16 (x * scale computed in f32), scale finite and > 0. Returns a
// u8 tensor of x's shape.
Tensor fp8_quantize(const Tensor& x, float scale, Fp8Format format, const Stream& stream);
// x' = float(q) * (1 / scale) in f32, q u8; returns dtype `out` (f32 or bf16, rounded to
// nearest even) of q's shape.
Tensor fp8_dequantize(const Tensor& q, float scale, Fp8Format format, DType out,
                      const Stream& stream);
// dequantize(quantize(x)): the value x has once it went through FP8 with this scale, in x's
// dtype. What the CPU emulation of an FP8 GEMM multiplies.
Tensor fp8_round_trip(const Tensor& x, float scale, Fp8Format format, const Stream& stream);

// ---- casts with the scale in a tensor (CPU or GPU; nothing waits for the GPU) ------------------
// A scale tensor is f32 [2] on the data's device: {1 / scale, scale} (the f32 reciprocal first),
// what an FP8 GEMM's epilogue multiplies by and what the casts multiply by. cuBLASLt reads the
// reciprocal through a pointer, and 13.1 runs no FP8 algorithm where that pointer is not 16-byte
// aligned: first in the tensor, it is as aligned as the allocation.
//
// The scale tensor {1 / scale, scale} for a host scale (finite, > 0), filled on stream.
Tensor fp8_scale_tensor(float scale, const Device& device, const Stream& stream);
// amax (f32 [1] holding a value >= 0, or NaN) becomes max(amax, the largest |x|) with fp8_amax's
// NaN and infinity rules; on a GPU an atomic max on the float's bits, no host wait.
void fp8_amax_into(const Tensor& x, const Tensor& amax, const Stream& stream);
// fp8_amax_into of several tensors: element i of amax (f32 [xs.size()], contiguous) max'ed with
// xs[i]'s amax. On a GPU one pass over each tensor and one launch for up to 4 tensors of one
// dtype (a linear layer's x and w).
void fp8_amaxes_into(const std::vector<Tensor>& xs, const Tensor& amax, const Stream& stream);

// An FP8 tensor as the GEMMs read it: data = fp8(x * scale) of x [rows, cols], and optionally its
// transpose [cols, rows] (Hopper's FP8 GEMM reads both operands with the reduced dimension
// contiguous, so a backward GEMM needs the transpose of what the forward read).
struct Fp8Tensor {
  Tensor data;        // u8 [rows, cols]
  Tensor transposed;  // u8 [cols, rows], or undefined
  Tensor scale;       // f32 [2] {1 / scale, scale}
  Fp8Format format = Fp8Format::e4m3;
};
// Casts x (f32 or bf16, viewed as [rows, cols] with cols its last dimension, rows the rest) at
// the scale of scale_t in one pass: the data (bit for bit fp8_quantize's), with `transposed` its
// transpose too, and with amax defined (as fp8_amax_into) x's amax max'ed into it.
Fp8Tensor fp8_cast(const Tensor& x, const Tensor& scale_t, Fp8Format format, bool transposed,
                   const Tensor& amax, const Stream& stream);
// One cast of fp8_casts: fp8_cast's arguments.
struct Fp8CastArgs {
  Tensor x;      // f32 or bf16
  Tensor scale;  // the scale tensor {1 / scale, scale}
  Fp8Format format = Fp8Format::e4m3;
  bool transposed = false;
  Tensor amax;  // undefined: none
};
// fp8_cast of each, in order, each result bit for bit fp8_cast's (its amax too). On a GPU the
// casts of one dtype and format whose shapes the vectorized kernel takes (16-byte rows; with the
// transpose, rows a multiple of 16) share a launch, up to 4 a launch: a linear layer's x and w in
// one launch and one tail instead of two.
std::vector<Fp8Tensor> fp8_casts(const std::vector<Fp8CastArgs>& casts, const Stream& stream);
// float(q) * (1 / scale) of q.data in dtype out (f32 or bf16), of q.data's shape: bit for bit
// fp8_dequantize's.
Tensor fp8_dequantize(const Fp8Tensor& q, DType out, const Stream& stream);

// ---- the FP8 GEMM ------------------------------------------------------------------------------
// The one FP8 matrix product of the linear layers (and the MoE experts), in "NT" row-major form:
//   y [n, m] = (1/scale_a) (1/scale_b) · a [n, k] · b [m, k]ᵀ  (+ bias [m])  (+ y with accumulate)
// with a and b FP8 u8 tensors (Fp8Tensor::data, any two formats but not both E5M2), both with k
// contiguous. Every GEMM of a linear layer y = x Wᵀ has this form:
//   forward  y  = q(x)  · q(W)ᵀ                a = x [rows, in],     b = W [out, in]
//   dgrad    dx = q(dy) · q(Wᵀ)ᵀ               a = dy [rows, out],   b = Wᵀ [in, out]
//   wgrad    dW += q(dyᵀ) · q(xᵀ)ᵀ (accumulate) a = dyᵀ [out, rows], b = xᵀ [in, rows]
// (the transposes come from fp8_cast). y: f32 or bf16 (f32 on the CPU), contiguous; bias
// undefined or [m] of y's dtype; accumulate: y += the product (y f32). The products are summed
// in f32.
//   - GPU: cuBLASLt's FP8 matmul ("TN" as cuBLAS counts it: A = b transposed, B = a) with
//     CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER the inverse scales read from the scale tensors (no
//     host wait), fast_accum (CUBLASLT_MATMUL_DESC_FAST_ACCUM; forward only, the backward keeps
//     it off) as asked. Where cuBLASLt has no FP8 algorithm (k, m or n not a multiple of 16, a
//     GPU before sm_89), the operands are dequantised to f32 and multiplied in f32: the same
//     result up to the summation order.
//   - CPU: the exact emulation: both dequantised to f32 (fp8_dequantize) and multiplied in f32.
void fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& bias, const Tensor& y,
              bool accumulate, bool fast_accum, const Stream& stream);
// db [cols] f32 += the column sums of q's dequantised values (the bias gradient of a layer whose
// output gradient went through FP8: the sum of what the GEMMs read).
void fp8_column_sum(const Fp8Tensor& q, const Tensor& db, const Stream& stream);

// ---- scaling ---------------------------------------------------------------------------------
// How a tensor's scale is chosen.
//   - current: from the amax of the very tensor being quantised (one more pass over it).
//   - delayed (Transformer Engine's DelayedScaling, amax_compute_algo "max"): from the largest
//     amax of the last `amax_history` steps; this step's amax enters the history when the step
//     ends (Fp8TensorScale::end_step), so a step's scale is known before its tensors are. Until
//     a tensor has a history (its first step, or while every amax so far was 0) it is scaled by
//     its own amax, as current scaling does (Transformer Engine starts from scale 1 instead,
//     which rounds small weights to E4M3's subnormals and makes the first step depend on how
//     the loss is divided among microbatches and replicas).
enum class Fp8Scaling : std::uint8_t { current, delayed };
const char* fp8_scaling_name(Fp8Scaling scaling);
// "current" / "delayed"; anything else throws InvalidArgument naming the accepted values.
Fp8Scaling parse_fp8_scaling(const std::string& name);

// Which GEMMs run in FP8: off, or hybrid (the linear layers' x and w in E4M3, dy in E5M2).
enum class Fp8Mode : std::uint8_t { off, hybrid };
const char* fp8_mode_name(Fp8Mode mode);
// "off" / "hybrid"; anything else throws InvalidArgument naming the accepted values.
Fp8Mode parse_fp8_mode(const std::string& name);

struct Fp8Recipe {
  Fp8Mode mode = Fp8Mode::off;
  Fp8Scaling scaling = Fp8Scaling::current;
  int amax_history = 16;  // delayed scaling: steps of history, >= 1
  int margin = 0;         // scale = fp8_max / amax / 2^margin, >= 0
};
// Throws InvalidArgument naming the field for amax_history < 1, margin < 0 or > 64.
void check_fp8_recipe(const Fp8Recipe& recipe);

// fp8_max(format) / amax / 2^margin in f32, as Transformer Engine computes it:
//   - amax == 0 (an all-zero tensor, or no history yet): `previous` (1 for a fresh tensor), as
//     any scale quantises zeros exactly;
//   - a scale that overflows f32 (a tiny amax) is the largest finite f32;
//   - a NaN or infinite amax throws InvalidArgument naming `what`: the tensor holds a non-finite
//     value and no scale represents it (the run has diverged; FP8 does not hide that).
float fp8_scale_from_amax(float amax, Fp8Format format, int margin, float previous,
                          const std::string& what);

// The scaling state of one tensor role (x, w or dy) of one layer: the amax history and the scale
// delayed scaling uses. Current scaling keeps no state across steps.
class Fp8TensorScale {
 public:
  Fp8TensorScale() = default;
  Fp8TensorScale(Fp8Format format, const Fp8Recipe& recipe, std::string what);

  Fp8Format format() const { return format_; }
  const Fp8Recipe& recipe() const { return recipe_; }
  const std::string& what() const { return what_; }

  // The scale to quantise a tensor whose amax is `amax` (already reduced over the ranks that
  // share the tensor, when uses_amax()): current scaling computes it from amax; delayed scaling
  // returns the scale fixed at the last end_step, whatever amax is, once there is a history. Either
  // way, with record, amax is recorded into this step's slot (the max over every tensor of the
  // step, e.g. all microbatches); an evaluation's forward or a recomputation records nothing.
  float scale(float amax, bool record = true);
  // This step's recorded amax (0 when nothing was recorded); what a communicator reduces (max)
  // before end_step when the ranks must agree.
  float step_amax() const { return step_amax_; }
  // Whether scale() depends on the amax it is given: current scaling, or delayed scaling before
  // the tensor has a history. The same on every rank whose histories are reduced together.
  bool uses_amax() const;
  void set_step_amax(float amax) { step_amax_ = amax; }
  // Delayed scaling: pushes this step's amax into the history (dropping the oldest), computes the
  // next step's scale from the history's max, and clears the step's slot. Current: clears it.
  void end_step();

  // The history, newest first (amax_history values), and the delayed scale: the state a
  // checkpoint saves. set_state validates the length and that values are finite and >= 0.
  const std::vector<float>& history() const { return history_; }
  float delayed_scale() const { return scale_; }
  void set_state(const std::vector<float>& history, float scale);

  // ---- the device form (the GPU path of the FP8 linear layers; no call waits for the GPU) ----
  // scale() on a device: amax is f32 [1] on the stream's device (already reduced as for
  // scale()); returns the scale tensor {1 / s, s} there with s the value scale() would return,
  // computed by a kernel, and with record max's amax into the device's step slot. A non-finite
  // amax is not refused here (that would wait for the GPU): it enters the step slot as +inf
  // (which no max-reduction drops) and end_device_step refuses it, naming the tensor, at the end
  // of the step.
  Tensor scale_on_device(const Tensor& amax, bool record, const Stream& stream);
  // scale_on_device of several scales (one launch on a GPU for up to 4): scales[i] with element
  // i of amax (f32 [scales.size()] on the stream's device), each result as scale_on_device's
  // (its own 16-byte-aligned tensor). amax may be undefined where no scale uses_amax() and record
  // is false (delayed scaling's known scales): nothing is read then, and a scale's tensor is
  // made once per step (returned again until end_device_step or set_state: the GEMMs and casts
  // only read it). The scales are distinct.
  static std::vector<Tensor> scales_on_device(const std::vector<Fp8TensorScale*>& scales,
                                              const Tensor& amax, bool record,
                                              const Stream& stream);
  // Whether scale_on_device has been used (the step amax is then the device's).
  bool on_device() const { return device_.defined(); }
  // The device state, f32 [2] {the delayed scale of this step, this step's amax}: what
  // end_device_step reads and resets (undefined before scale_on_device).
  const Tensor& device_state() const { return device_; }
  // The device's step slot (f32 [1], a view of device_state()): given to nn::fp8_cast as its
  // amax, the cast records the tensor's amax there in its own pass (delayed scaling, whose scale
  // is known before the tensor is read).
  Tensor step_amax_slot() const { return device_.narrow(0, 1, 1); }
  // end_step() for a scale on a device, given its step amax read back from the device (and
  // reduced as for end_step): refuses a non-finite amax naming the tensor, then end_step(), and
  // resets the device state to {delayed_scale(), 0} on stream.
  void end_device_step(float step_amax, const Stream& stream);

 private:
  Fp8Format format_ = Fp8Format::e4m3;
  Fp8Recipe recipe_;
  std::string what_;
  std::vector<float> history_;  // newest first
  float scale_ = 1.0f;          // delayed scaling's scale for the current step
  float step_amax_ = 0.0f;
  Tensor device_;  // f32 [2] on the GPU: {scale_, step amax}
  // scales_on_device's tensor of this step's delayed scale (undefined: not made yet this step).
  Tensor known_scale_;
  // device_, made on the device (from scale_ and step_amax_) where it is not there yet.
  const Tensor& device_state_on(const Device& device, const Stream& stream);
};

}  // namespace quintet::nn
