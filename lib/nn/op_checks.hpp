// Private: argument checks shared by the op dispatch (ops.cpp, ops_train.cpp). Each throws
// InvalidArgument naming the op, the argument, what was expected and what was found.
#pragma once

#include <string>

#include "nn/op_dispatch.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn::detail {

// Checks one op's arguments against the stream's device and the op's compute dtype.
class OpChecker {
 public:
  // Throws at once for a CUDA stream when this build has no CUDA nn kernels.
  OpChecker(const char* op, const Stream& stream) : op_(op), device_(stream.device()) {
    if (!QUINTET_NN_HAS_CUDA_OPS && device_.is_cuda()) throw_no_cuda_ops(op_, device_);
  }

  const char* op() const { return op_; }
  const Device& device() const { return device_; }
  bool on_cuda() const { return device_.is_cuda(); }

  // t is defined and lives on the stream's device.
  void on_device(const char* name, const Tensor& t) const {
    QUINTET_CHECK(t.defined(), "{}: {} is an undefined tensor", op_, name);
    QUINTET_CHECK(t.device() == device_,
                  "{}: {} is on {} but the stream is on {}; put every tensor of one call and its "
                  "stream on one device",
                  op_, name, t.device().str(), device_.str());
  }

  // t is a valid compute tensor (f32/f64 on the CPU, bf16/f32 on a GPU); returns its dtype.
  DType compute(const char* name, const Tensor& t) const {
    on_device(name, t);
    const DType d = t.dtype();
    const bool ok =
        on_cuda() ? (d == DType::bf16 || d == DType::f32) : (d == DType::f32 || d == DType::f64);
    QUINTET_CHECK(ok, "{}: {} has dtype {}; on {} the ops compute in {}", op_, name, dtype_name(d),
                  device_.str(), on_cuda() ? "bf16 or f32" : "f32 (or f64)");
    return d;
  }

  // t is a compute tensor of dtype `dtype` (the dtype of the call's first input).
  void compute_as(const char* name, const Tensor& t, DType dtype) const {
    compute(name, t);
    QUINTET_CHECK(t.dtype() == dtype, "{}: {} has dtype {} but the other inputs are {}; cast it",
                  op_, name, dtype_name(t.dtype()), dtype_name(dtype));
  }

  void shape(const char* name, const Tensor& t, const Shape& expected) const {
    QUINTET_CHECK(t.shape() == expected, "{}: {} has shape {}, expected {}", op_, name,
                  shape_str(t.shape()), shape_str(expected));
  }

  // An accumulator (grad or statistic) of accum_dtype(compute), given shape, contiguous.
  void accumulator(const char* name, const Tensor& t, DType compute, const Shape& expected) const {
    on_device(name, t);
    QUINTET_CHECK(t.dtype() == accum_dtype(compute),
                  "{}: {} has dtype {}, expected {} (gradients and statistics of {} inputs)", op_,
                  name, dtype_name(t.dtype()), dtype_name(accum_dtype(compute)),
                  dtype_name(compute));
    shape(name, t, expected);
    QUINTET_CHECK(t.is_contiguous(), "{}: {} must be contiguous (it is written in place)", op_,
                  name);
  }

  // t has at least `dims` dimensions; returns its last dimension.
  std::int64_t last_dim(const char* name, const Tensor& t, int dims = 1) const {
    QUINTET_CHECK(t.dim() >= dims, "{}: {} has shape {}, expected at least {} dimension(s)", op_,
                  name, shape_str(t.shape()), dims);
    return t.size(t.dim() - 1);
  }

  // Index tensors: i32 or i64.
  void ids(const char* name, const Tensor& t) const {
    on_device(name, t);
    QUINTET_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64,
                  "{}: {} has dtype {}, expected i32 or i64", op_, name, dtype_name(t.dtype()));
  }

 private:
  const char* op_;
  Device device_;
};

// The shape with the last dimension replaced.
// targets [...] (ids) has the shape of logits [..., V] without the last dimension (a scalar
// target for 1-D logits).
inline void check_targets(const OpChecker& c, const Tensor& logits, const Tensor& targets) {
  c.ids("targets", targets);
  Shape expected = logits.shape();
  expected.pop_back();
  QUINTET_CHECK(targets.shape() == expected || (expected.empty() && targets.numel() == 1),
                "{}: targets have shape {}, expected {} (logits {} without the vocabulary)", c.op(),
                shape_str(targets.shape()), shape_str(expected), shape_str(logits.shape()));
}

inline Shape with_last(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// Rows of a tensor viewed as [rows, last].
inline std::int64_t rows_of(const Tensor& t) {
  const std::int64_t last = t.size(t.dim() - 1);
  return last == 0 ? 0 : t.numel() / last;
}

// A contiguous tensor viewed as [rows, last] (copied on stream when t is strided).
inline Tensor as_rows(const Tensor& t, const Stream& stream) {
  const Tensor c = t.contiguous(stream);
  return c.view({rows_of(t), t.size(t.dim() - 1)});
}

// An FP8 scale tensor: f32 [2] {1 / scale, scale} on the stream's device (quintet/nn/fp8.hpp).
inline void check_scale_tensor(const OpChecker& c, const char* name, const Tensor& t) {
  c.on_device(name, t);
  QUINTET_CHECK(t.dtype() == DType::f32 && t.shape() == Shape{2} && t.is_contiguous(),
                "{}: {} is {} {}, expected a contiguous f32 [2] scale tensor {{1 / scale, scale}}",
                c.op(), name, dtype_name(t.dtype()), shape_str(t.shape()));
}

}  // namespace quintet::nn::detail
