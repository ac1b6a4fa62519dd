// The sequence and reduction regions of tensor parallelism. The communicator concatenates along
// the flat buffer, so moving chunks along dim 1 of [B, S, ...] goes through a [tp, B, S/tp, ...]
// layout: one transposing copy after the all-gather, one before the reduce-scatter (none for
// B = 1, where the two layouts coincide).
#include "parallel/tensor_parallel/internal/regions.hpp"

#include "quintet/parallel/tensor_parallel/regions.hpp"

namespace quintet::tensor_parallel {

void check_divisible(const char* what, std::int64_t size, int tp) {
  QUINTET_CHECK(size > 0 && tp > 0 && size % tp == 0,
                "{} = {} is not divisible by the tensor-parallel size tp = {}; choose a {} that is "
                "a multiple of {} or another tp",
                what, size, tp, what, tp);
}

namespace detail {

void check_sequence(const char* what, const Tensor& x, int tp) {
  QUINTET_CHECK(x.defined() && x.dim() >= 2, "{}: expected [batch, seq, ...], got {}", what,
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  QUINTET_CHECK(x.size(1) % tp == 0,
                "{}: sequence length seq = {} is not divisible by the tensor-parallel size tp = {} "
                "(sequence parallelism splits it evenly); pad or choose seq a multiple of {}",
                what, x.size(1), tp, tp);
}

Pending start_all_reduce(const Tensor& x, Communicator& tp, const Stream& stream) {
  if (tp.size() == 1) return {x, Work()};
  Work w = tp.all_reduce(x, x, ReduceOp::sum, stream);
  return {x, std::move(w)};
}

Pending start_reduce_scatter_sequence(const Tensor& x, Communicator& tp, const Stream& stream) {
  const int n = tp.size();
  check_sequence("reduce_scatter_sequence", x, n);
  if (n == 1) return {x, Work()};
  const std::int64_t b = x.size(0), local = x.size(1) / n;
  const std::int64_t inner =
      x.numel() == 0 ? 0 : x.numel() / (b * x.size(1));  // elements per position
  Shape out_shape = x.shape();
  out_shape[1] = local;
  // [B, S, ...] = [B, tp, S/tp * inner] -> [tp, B, S/tp * inner]: block r is chunk r of every row.
  const Tensor in =
      b == 1 ? x.contiguous(stream)
             : x.contiguous(stream).view({b, n, local * inner}).transpose(0, 1).contiguous(stream);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device(), stream);
  Work w = tp.reduce_scatter(in, out, ReduceOp::sum, stream);
  return {out, std::move(w)};
}

}  // namespace detail

Tensor gather_sequence(const Tensor& x, Communicator& tp, const Stream& stream) {
  const int n = tp.size();
  QUINTET_CHECK(x.defined() && x.dim() >= 2,
                "gather_sequence: expected [batch, seq/tp, ...], got {}",
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  if (n == 1) return x;
  const std::int64_t b = x.size(0), local = x.size(1);
  const std::int64_t inner = x.numel() == 0 ? 0 : x.numel() / (b * local);
  Shape full = x.shape();
  full[1] = local * n;
  Tensor gathered = Tensor::empty({n, b, local * inner}, x.dtype(), x.device(), stream);
  tp.all_gather(x.contiguous(stream), gathered, stream).wait(stream);
  if (b == 1) return gathered.view(full);
  // [tp, B, S/tp * inner] -> [B, tp, S/tp * inner] = [B, S, ...]
  return gathered.transpose(0, 1).contiguous(stream).view(full);
}

Tensor reduce_scatter_sequence(const Tensor& x, Communicator& tp, const Stream& stream) {
  return detail::start_reduce_scatter_sequence(x, tp, stream).finish(stream);
}

Tensor all_reduce_tp(const Tensor& x, Communicator& tp, const Stream& stream) {
  if (tp.size() == 1) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device(), stream);
  tp.all_reduce(x.contiguous(stream), out, ReduceOp::sum, stream).wait(stream);
  return out;
}

}  // namespace quintet::tensor_parallel
