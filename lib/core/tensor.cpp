#include "quintet/core/tensor.hpp"

#include <algorithm>
#include <limits>

#include "core/internal/cuda_stream.hpp"
#include "core/internal/host_sync.hpp"
#include "core/internal/tensor_kernels.hpp"
#include "quintet/core/allocator.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/random.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace quintet {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    QUINTET_CHECK(shape[i] >= 0, "shape {} has a negative size at dimension {}", shape_str(shape),
                  i);
    QUINTET_CHECK(shape[i] == 0 || n <= std::numeric_limits<std::int64_t>::max() / shape[i],
                  "shape {} has more elements than fit in int64", shape_str(shape));
    n *= shape[i];
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<std::int64_t>(shape[i + 1], 1);
  }
  return strides;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// ---------------------------------------------------------------------------------------------
// Construction

Tensor Tensor::from_storage(std::shared_ptr<void> storage, std::size_t storage_bytes,
                            const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  const std::size_t need = static_cast<std::size_t>(t.numel_) * dtype_size(dtype);
  QUINTET_CHECK(need <= storage_bytes,
                "Tensor::from_storage: shape {} of {} needs {} bytes, storage has {}",
                shape_str(shape), dtype_name(dtype), need, storage_bytes);
  QUINTET_CHECK(storage != nullptr || t.numel_ == 0, "Tensor::from_storage: null storage");
  t.storage_ = std::move(storage);
  t.storage_bytes_ = storage_bytes;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.defined_ = true;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_device(device);
  return empty(shape, dtype, device, Stream::default_stream(device));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, const Stream& stream) {
  const std::int64_t n = shape_numel(shape);
  check_device(device);
  QUINTET_CHECK(
      static_cast<std::uint64_t>(n) <= std::numeric_limits<std::size_t>::max() / dtype_size(dtype),
      "shape {} of {} is too large to allocate", shape_str(shape), dtype_name(dtype));
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  return from_storage(allocate(bytes, device, stream), bytes, shape, dtype, device);
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  return from_storage(pinned_allocate(bytes), bytes, shape, dtype, Device::cpu());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::arange(std::int64_t n, DType dtype, Device device) {
  QUINTET_CHECK(n >= 0, "Tensor::arange({}): n must be >= 0", n);
  Tensor host = empty({n}, dtype, Device::cpu());
  for (std::int64_t i = 0; i < n; ++i) {
    store_from_double(host.data_ptr(), dtype, static_cast<std::size_t>(i), static_cast<double>(i));
  }
  return host.to(device);
}

Tensor Tensor::rand(const Shape& shape, std::uint64_t seed, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_uniform(t, RandomKey{seed, 0, 0});
  return t;
}

Tensor Tensor::randn(const Shape& shape, std::uint64_t seed, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_normal(t, RandomKey{seed, 0, 0});
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  check_device(device);
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  return from_storage(std::shared_ptr<void>(data, [](void*) {}), bytes, shape, dtype, device);
}

// ---------------------------------------------------------------------------------------------
// Accessors

void Tensor::check_defined(const char* what) const {
  QUINTET_CHECK(defined_, "Tensor::{} on an undefined tensor", what);
}

std::int64_t Tensor::size(int d) const {
  check_defined("size");
  const int n = dim();
  QUINTET_CHECK(d >= -n && d < n, "dimension {} out of range for a {}-D tensor", d, n);
  return shape_[d < 0 ? d + n : d];
}

std::int64_t Tensor::stride(int d) const {
  check_defined("stride");
  const int n = dim();
  QUINTET_CHECK(d >= -n && d < n, "dimension {} out of range for a {}-D tensor", d, n);
  return strides_[d < 0 ? d + n : d];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data_at(std::int64_t element_offset) const {
  if (storage_ == nullptr) return nullptr;
  return static_cast<char*>(storage_.get()) +
         static_cast<std::size_t>(element_offset) * element_size();
}

void* Tensor::data_ptr() const { return raw_data_at(offset_); }

std::int64_t Tensor::element_offset(std::initializer_list<std::int64_t> index) const {
  check_defined("element access");
  QUINTET_CHECK(static_cast<int>(index.size()) == dim(),
                "element access with {} indices on a {}-D tensor of shape {}", index.size(), dim(),
                shape_str(shape_));
  std::int64_t off = offset_;
  int d = 0;
  for (std::int64_t i : index) {
    QUINTET_CHECK(i >= 0 && i < shape_[d], "index {} out of range [0, {}) at dimension {}", i,
                  shape_[d], d);
    off += i * strides_[d];
    ++d;
  }
  return off;
}

std::string Tensor::str() const {
  if (!defined_) return "Tensor(undefined)";
  return fmt::format("Tensor(shape={}, dtype={}, device={})", shape_str(shape_), dtype_name(dtype_),
                     device_.str());
}

// ---------------------------------------------------------------------------------------------
// Views

Tensor Tensor::view(const Shape& shape) const {
  check_defined("view");
  Shape resolved = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      QUINTET_CHECK(infer < 0, "Tensor::view({}): only one dimension may be -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      QUINTET_CHECK(shape[i] >= 0, "Tensor::view({}): negative size at dimension {}",
                    shape_str(shape), i);
      known = shape_numel({known, shape[i]});
    }
  }
  if (infer >= 0) {
    QUINTET_CHECK(known != 0 && numel_ % known == 0,
                  "Tensor::view({}): cannot infer -1 for {} elements of shape {}", shape_str(shape),
                  numel_, shape_str(shape_));
    resolved[infer] = numel_ / known;
  }
  QUINTET_CHECK(shape_numel(resolved) == numel_,
                "Tensor::view: shape {} has {} elements but the tensor of shape {} has {}",
                shape_str(resolved), shape_numel(resolved), shape_str(shape_), numel_);
  QUINTET_CHECK(is_contiguous(),
                "Tensor::view needs a contiguous tensor (shape {}, strides {}); "
                "call contiguous() first",
                shape_str(shape_), shape_str(strides_));
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::slice(int d, std::int64_t start, std::int64_t end) const {
  check_defined("slice");
  const int n = dim();
  QUINTET_CHECK(d >= -n && d < n, "Tensor::slice: dimension {} out of range for {}-D", d, n);
  if (d < 0) d += n;
  const std::int64_t len = shape_[d];
  if (start < 0) start += len;
  if (end < 0) end += len;
  QUINTET_CHECK(start >= 0 && start <= end && end <= len,
                "Tensor::slice: [{}, {}) is not within [0, {}] of dimension {} (shape {})", start,
                end, len, d, shape_str(shape_));
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  t.numel_ = shape_numel(t.shape_);
  return t;
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  QUINTET_CHECK(length >= 0, "Tensor::narrow: negative length {}", length);
  QUINTET_CHECK(start >= 0, "Tensor::narrow: negative start {}", start);
  return slice(d, start, start + length);
}

Tensor Tensor::transpose(int d0, int d1) const {
  check_defined("transpose");
  const int n = dim();
  QUINTET_CHECK(d0 >= -n && d0 < n && d1 >= -n && d1 < n,
                "Tensor::transpose({}, {}) out of range for a {}-D tensor", d0, d1, n);
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::select(std::int64_t i) const {
  check_defined("select");
  QUINTET_CHECK(dim() >= 1, "Tensor::select on a 0-D tensor");
  QUINTET_CHECK(i >= 0 && i < shape_[0], "Tensor::select({}) out of range [0, {})", i, shape_[0]);
  Tensor t = *this;
  t.offset_ += i * strides_[0];
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  t.numel_ = shape_numel(t.shape_);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Copies

namespace {

#if QUINTET_HAS_CUDA
bool is_pinned_host(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// Copies between two contiguous tensors of the same size on any devices, on stream.
// Returns true when the copy may still be in flight when this returns.
bool copy_contiguous_bytes(const Tensor& dst, const Tensor& src, cudaStream_t stream) {
  const std::size_t bytes = dst.nbytes();
  if (dst.device().is_cuda() && src.device().is_cuda() && dst.device() != src.device()) {
    QUINTET_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data_ptr(), dst.device().index(), src.data_ptr(),
                                           src.device().index(), bytes, stream));
  } else {
    QUINTET_CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDefault, stream));
  }
  return true;
}
#endif

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  const detail::OneHostSync one;  // the copy and its synchronize: one wait
  const Device& gpu = device_.is_cuda() ? device_ : src.device();
  if (gpu.is_cpu()) return copy_(src, Stream());
  Stream stream = Stream::default_stream(gpu);
  copy_(src, stream);
  stream.synchronize();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src, const Stream& stream) {
  check_defined("copy_");
  QUINTET_CHECK(src.defined(), "Tensor::copy_ from an undefined tensor");
  QUINTET_CHECK(src.shape() == shape_, "Tensor::copy_: source shape {} differs from destination {}",
                shape_str(src.shape()), shape_str(shape_));
  QUINTET_CHECK(src.dtype() == dtype_,
                "Tensor::copy_: source dtype {} differs from destination {}; convert with to({})",
                dtype_name(src.dtype()), dtype_name(dtype_), dtype_name(dtype_));
  check_device(device_);
  check_device(src.device());
  if (numel_ == 0) return *this;
  if (device_.is_cpu() && src.device().is_cpu()) {
    detail::cpu_copy_convert(*this, src);
    return *this;
  }
#if QUINTET_HAS_CUDA
  const Device& gpu = device_.is_cuda() ? device_ : src.device();
  DeviceGuard guard(gpu);
  cudaStream_t s = detail::cuda_stream_of(stream);
  if (device_ == src.device()) {
    detail::cuda_copy_convert(*this, src, s);
    return *this;
  }
  // Across devices: bring both sides to contiguous form on their own device, copy the bytes,
  // and scatter into a strided destination on its device.
  Tensor from = src.is_contiguous() ? src : src.contiguous(stream);
  Tensor into = is_contiguous() ? *this : Tensor::empty(shape_, dtype_, device_, stream);
  copy_contiguous_bytes(into, from, s);
  if (!into.shares_storage(*this)) {
    if (device_.is_cuda()) {
      detail::cuda_copy_convert(*this, into, s);
    } else {
      detail::note_host_sync();
      QUINTET_CUDA_CHECK(cudaStreamSynchronize(s));
      detail::cpu_copy_convert(*this, into);
    }
  }
  // Pageable host memory (or a temporary) must outlive the copy: finish it before returning.
  const bool host_temp = (src.device().is_cpu() && !from.shares_storage(src)) ||
                         (device_.is_cpu() && !into.shares_storage(*this));
  const Tensor& host = src.device().is_cpu() ? from : into;
  if (host_temp || !is_pinned_host(host.data_ptr())) {
    detail::note_host_sync();
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  return *this;
#else
  (void)stream;
  QUINTET_THROW(InvalidArgument, "Tensor::copy_ between {} and {}: built without CUDA",
                src.device().str(), device_.str());
#endif
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::contiguous(const Stream& stream) const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device_, stream);
  out.copy_(*this, stream);
  return out;
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty(shape_, dtype_, device_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone(const Stream& stream) const {
  check_defined("clone");
  Tensor out = empty(shape_, dtype_, device_, stream);
  out.copy_(*this, stream);
  return out;
}

Tensor Tensor::to(const Device& device) const {
  check_defined("to");
  // A read on the host counts from every device, a CPU tensor's too (host_sync_count).
  const detail::OneHostSync one;
  if (device.is_cpu()) detail::note_host_sync();
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(const Device& device, const Stream& stream) const {
  check_defined("to");
  if (device == device_) return *this;
  Tensor out =
      device.is_cpu() ? empty_pinned(shape_, dtype_) : empty(shape_, dtype_, device, stream);
  out.copy_(*this, stream);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_defined("to");
  if (dtype == dtype_) return *this;
  if (device_.is_cpu()) return to(dtype, Stream());
  Stream stream = Stream::default_stream(device_);
  Tensor out = to(dtype, stream);
  stream.synchronize();
  return out;
}

Tensor Tensor::to(DType dtype, const Stream& stream) const {
  check_defined("to");
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device_, stream);
  if (numel_ == 0) return out;
  if (device_.is_cpu()) {
    detail::cpu_copy_convert(out, *this);
  } else {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(device_);
    detail::cuda_copy_convert(out, *this, detail::cuda_stream_of(stream));
#endif
  }
  return out;
}

Tensor& Tensor::fill_(double value) {
  if (device_.is_cpu()) return fill_(value, Stream());
  Stream stream = Stream::default_stream(device_);
  fill_(value, stream);
  stream.synchronize();
  return *this;
}

Tensor& Tensor::fill_(double value, const Stream& stream) {
  check_defined("fill_");
  if (numel_ == 0) return *this;
  if (device_.is_cpu()) {
    detail::cpu_fill(*this, value);
  } else {
#if QUINTET_HAS_CUDA
    DeviceGuard guard(device_);
    detail::cuda_fill(*this, value, detail::cuda_stream_of(stream));
#else
    (void)stream;
#endif
  }
  return *this;
}

double Tensor::item(std::initializer_list<std::int64_t> index) const {
  const std::int64_t off = element_offset(index);
  const detail::OneHostSync once;
  detail::note_host_sync();
  if (device_.is_cpu()) return load_as_double(raw_data_at(off), dtype_, 0);
  Tensor one = Tensor::from_storage(storage_, storage_bytes_, {1}, dtype_, device_);
  one.offset_ = off;
  return one.to(Device::cpu()).item({0});
}

namespace detail {

void copy_host_to_tensor(const void* src, DType dtype, const Tensor& dst) {
  Tensor blob = Tensor::from_blob(const_cast<void*>(src), dst.shape(), dtype, Device::cpu());
  Tensor d = dst;
  d.copy_(blob);
}

Tensor host_contiguous(const Tensor& t) {
  QUINTET_CHECK(t.defined(), "reading an undefined tensor");
  const OneHostSync one;
  note_host_sync();
  if (t.device().is_cpu() && t.is_contiguous()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  h.copy_(t);
  return h;
}

}  // namespace detail
}  // namespace quintet
