// CPU element-wise kernels behind Tensor: strided copy with conversion, fill, random fill.
#include <cstring>
#include <vector>

#include "core/internal/tensor_kernels.hpp"
#include "quintet/core/philox.hpp"

namespace quintet::detail {

namespace {

// Calls f(dst_offset, src_offset) for every coordinate of shape in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& dst_strides, std::int64_t dst_base,
                     const Shape& src_strides, std::int64_t src_base, F&& f) {
  const int n = static_cast<int>(shape.size());
  const std::int64_t total = shape_numel(shape);
  if (total == 0) return;
  std::vector<std::int64_t> coord(static_cast<std::size_t>(n), 0);
  std::int64_t d = dst_base, s = src_base;
  for (std::int64_t i = 0; i < total; ++i) {
    f(d, s);
    for (int k = n - 1; k >= 0; --k) {
      if (++coord[k] < shape[k]) {
        d += dst_strides[k];
        s += src_strides[k];
        break;
      }
      d -= dst_strides[k] * (shape[k] - 1);
      s -= src_strides[k] * (shape[k] - 1);
      coord[k] = 0;
    }
  }
}

char* storage_base(const Tensor& t) { return static_cast<char*>(t.storage().get()); }

}  // namespace

void cpu_copy_convert(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());  // the common case: bytes
    return;
  }
  const int nd = dst.dim();
  if (dst.dtype() == src.dtype() && nd >= 2 && dst.stride(nd - 1) == 1 && src.stride(nd - 1) == 1) {
    // Rows contiguous on both sides (a transposed or sliced outer layout): one move per row.
    const std::size_t row_bytes = static_cast<std::size_t>(dst.size(nd - 1)) * dst.element_size();
    const Shape outer(dst.shape().begin(), dst.shape().end() - 1);
    const Shape dst_outer(dst.strides().begin(), dst.strides().end() - 1);
    const Shape src_outer(src.strides().begin(), src.strides().end() - 1);
    char* dp = storage_base(dst);
    const char* sp = storage_base(src);
    const std::size_t es = dst.element_size();
    for_each_offset(outer, dst_outer, dst.offset(), src_outer, src.offset(),
                    [&](std::int64_t d, std::int64_t s) {
                      std::memmove(dp + static_cast<std::size_t>(d) * es,
                                   sp + static_cast<std::size_t>(s) * es, row_bytes);
                    });
    return;
  }
  dispatch_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* dp = reinterpret_cast<D*>(storage_base(dst));
      const S* sp = reinterpret_cast<const S*>(storage_base(src));
      for_each_offset(dst.shape(), dst.strides(), dst.offset(), src.strides(), src.offset(),
                      [&](std::int64_t d, std::int64_t s) { dp[d] = convert_scalar<D>(sp[s]); });
    });
  });
}

void cpu_fill(const Tensor& dst, double value) {
  dispatch_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert_scalar<T>(value);
    T* p = reinterpret_cast<T*>(storage_base(dst));
    for_each_offset(dst.shape(), dst.strides(), dst.offset(), dst.strides(), 0,
                    [&](std::int64_t d, std::int64_t) { p[d] = v; });
  });
}

void cpu_fill_random(const Tensor& dst, const RandomKey& key, Distribution dist, float lo, float hi,
                     const RandomRegion& region) {
  const Shape full_strides = contiguous_strides(region.full_shape);
  std::int64_t base = 0;
  for (std::size_t k = 0; k < region.start.size(); ++k) base += region.start[k] * full_strides[k];
  dispatch_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(storage_base(dst));
    for_each_offset(dst.shape(), dst.strides(), dst.offset(), full_strides, base,
                    [&](std::int64_t d, std::int64_t g) {
                      const auto w = philox::draw(key.seed, key.stream_id,
                                                  key.offset + static_cast<std::uint64_t>(g));
                      const float x = dist == Distribution::uniform
                                          ? lo + (hi - lo) * philox::uniform01(w.v[0])
                                          : lo + hi * philox::normal(w.v[0], w.v[1]);
                      p[d] = convert_scalar<T>(x);
                    });
  });
}

RandomRegion resolve_region(const Tensor& out, const RandomRegion& region) {
  QUINTET_CHECK(is_floating(out.dtype()), "random fill needs a floating dtype, got {}",
                dtype_name(out.dtype()));
  if (region.full_shape.empty() && region.start.empty()) {
    return RandomRegion{out.shape(), Shape(out.shape().size(), 0)};
  }
  QUINTET_CHECK(
      region.full_shape.size() == out.shape().size() && region.start.size() == out.shape().size(),
      "random region: full shape {} and start {} must have the tensor's {} dimensions",
      shape_str(region.full_shape), shape_str(region.start), out.dim());
  for (int k = 0; k < out.dim(); ++k) {
    QUINTET_CHECK(region.start[k] >= 0 && region.start[k] + out.size(k) <= region.full_shape[k],
                  "random region: a block of shape {} at {} does not fit in full shape {}",
                  shape_str(out.shape()), shape_str(region.start), shape_str(region.full_shape));
  }
  shape_numel(region.full_shape);
  return region;
}

}  // namespace quintet::detail
