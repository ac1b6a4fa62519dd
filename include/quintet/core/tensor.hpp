// Tensor: a strided view of typed memory on the CPU or a GPU.
//
// A Tensor is shared storage + an element offset + shape + strides (in elements) + dtype +
// device. Copying a Tensor copies the handle, not the data; views (view, slice/narrow,
// transpose) share storage; contiguous(), clone(), to() and copy_() copy data. It is not an
// autograd tensor: gradients are explicit (see nn/module.hpp).
//
// Operations that touch GPU memory take the Stream they run on and are asynchronous with respect
// to the host unless they say otherwise. Shapes and counts are in elements; nbytes() is bytes.
// Bad input (negative or overflowing shapes, mismatched shapes/dtypes/devices, out-of-range
// indices or devices) throws quintet::Error with InvalidArgument before anything is touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "quintet/core/device.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/stream.hpp"

namespace quintet {

using Shape = std::vector<std::int64_t>;

// Number of elements of shape; throws InvalidArgument on a negative size or int64 overflow.
std::int64_t shape_numel(const Shape& shape);
// Row-major (C order) strides of shape, in elements.
Shape contiguous_strides(const Shape& shape);
// "[2, 3, 4]"
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  // An undefined tensor (defined() == false); most methods throw on it.
  Tensor() = default;

  // Uninitialised memory. On a GPU, allocated in stream's pool (the default stream if omitted).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor empty(const Shape& shape, DType dtype, Device device, const Stream& stream);
  // Like empty but in pinned (page-locked) host memory, for fast asynchronous transfers.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // 0, 1, ..., n-1 as a 1-D tensor.
  static Tensor arange(std::int64_t n, DType dtype = DType::f32, Device device = Device::cpu());
  // Uniform in [0, 1) / standard normal, drawn from Philox(seed, stream_id=0, offset=0): the same
  // values on the CPU and the GPU (see random.hpp for sharded draws).
  static Tensor rand(const Shape& shape, std::uint64_t seed, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor randn(const Shape& shape, std::uint64_t seed, DType dtype = DType::f32,
                      Device device = Device::cpu());
  // Copies values (host) into a new tensor of shape on device; values.size() must be its numel.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // Wraps memory the caller owns (not freed by the tensor); contiguous.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device);
  // A tensor over existing storage (for flat buffers and allocators built on Tensor).
  static Tensor from_storage(std::shared_ptr<void> storage, std::size_t storage_bytes,
                             const Shape& shape, DType dtype, Device device);

  bool defined() const { return defined_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t size(int dim) const;
  std::int64_t stride(int dim) const;
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  std::size_t element_size() const { return dtype_size(dtype_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * element_size(); }
  std::int64_t offset() const { return offset_; }  // in elements from the storage start
  bool is_contiguous() const;
  // Address of element 0 (storage start + offset).
  void* data_ptr() const;
  // Typed pointer to element 0; throws when T does not match dtype().
  template <class T>
  T* data() const;
  // True when both tensors view the same storage (not necessarily the same elements).
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  const std::shared_ptr<void>& storage() const { return storage_; }

  // ---- Views (share storage) ----
  // Same elements, new shape (one dimension may be -1); needs a contiguous tensor.
  Tensor view(const Shape& shape) const;
  // Elements [start, end) of dim; negative indices count from the end.
  Tensor slice(int dim, std::int64_t start, std::int64_t end) const;
  // Elements [start, start + length) of dim.
  Tensor narrow(int dim, std::int64_t start, std::int64_t length) const;
  Tensor transpose(int dim0, int dim1) const;
  // Index i of dimension 0, dropping that dimension.
  Tensor select(std::int64_t i) const;
  Tensor flatten() const { return view({-1}); }

  // ---- Copies ----
  // This tensor if contiguous, else a contiguous copy made on stream.
  Tensor contiguous() const;
  Tensor contiguous(const Stream& stream) const;
  Tensor clone() const;
  Tensor clone(const Stream& stream) const;
  // Copies src into this tensor (same shape and dtype; any devices). Host<->device copies from or
  // to pinned memory are asynchronous on stream; other host memory makes the copy synchronous.
  Tensor& copy_(const Tensor& src);
  Tensor& copy_(const Tensor& src, const Stream& stream);
  // A copy on device (this tensor itself when already there). Without a stream the copy is
  // finished on return; with one it is queued on stream, and a copy to the CPU lands in pinned
  // memory that must not be read before stream is synchronised.
  Tensor to(const Device& device) const;
  Tensor to(const Device& device, const Stream& stream) const;
  // A converted copy (this tensor itself when already of dtype); same device.
  Tensor to(DType dtype) const;
  Tensor to(DType dtype, const Stream& stream) const;
  // Sets every element to value (converted to dtype).
  Tensor& fill_(double value);
  Tensor& fill_(double value, const Stream& stream);
  Tensor& zero_() { return fill_(0.0); }

  // ---- Element access (host) ----
  // Reference to one element of a CPU tensor; throws for a GPU tensor, a wrong T or index.
  template <class T>
  T& at(std::initializer_list<std::int64_t> index) const;
  // Value of one element as double, from any device (a GPU read synchronises).
  double item(std::initializer_list<std::int64_t> index = {}) const;
  // All elements in row-major order, converted to T (float, double, int64_t, ...). GPU tensors
  // are copied to the host (synchronising).
  template <class T>
  std::vector<T> to_vector() const;

  std::string str() const;  // "Tensor(shape=[2, 3], dtype=f32, device=cpu)"

 private:
  std::int64_t element_offset(std::initializer_list<std::int64_t> index) const;
  void check_defined(const char* what) const;
  void* raw_data_at(std::int64_t element_offset) const;

  std::shared_ptr<void> storage_;
  std::size_t storage_bytes_ = 0;
  std::int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
  bool defined_ = false;
};

// ---- Implementation details below ----

template <class T>
T* Tensor::data() const {
  check_defined("data");
  QUINTET_CHECK(dtype_of<T> == dtype_, "Tensor::data<{}>() on a tensor of dtype {}",
                dtype_name(dtype_of<T>), dtype_name(dtype_));
  return static_cast<T*>(data_ptr());
}

template <class T>
T& Tensor::at(std::initializer_list<std::int64_t> index) const {
  QUINTET_CHECK(device_.is_cpu(),
                "Tensor::at needs a CPU tensor, got one on {}; use item() or "
                "to(Device::cpu())",
                device_.str());
  QUINTET_CHECK(dtype_of<T> == dtype_, "Tensor::at<{}>() on a tensor of dtype {}",
                dtype_name(dtype_of<T>), dtype_name(dtype_));
  return *static_cast<T*>(raw_data_at(element_offset(index)));
}

namespace detail {
// Copies a contiguous host buffer of dtype into dst (any device), synchronously.
void copy_host_to_tensor(const void* src, DType dtype, const Tensor& dst);
// A contiguous CPU copy of t (t itself when already so), synchronising with the GPU if needed.
Tensor host_contiguous(const Tensor& t);
}  // namespace detail

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  Tensor t = Tensor::empty(shape, dtype_of<T>, device);
  QUINTET_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
                "Tensor::from_vector: {} values for shape {} ({} elements)", values.size(),
                shape_str(shape), t.numel());
  if (t.numel() > 0) detail::copy_host_to_tensor(values.data(), dtype_of<T>, t);
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor h = detail::host_contiguous(*this);
  std::vector<T> out(static_cast<std::size_t>(h.numel()));
  dispatch_dtype(h.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* p = static_cast<const S*>(h.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert_scalar<T>(p[i]);
  });
  return out;
}

}  // namespace quintet
