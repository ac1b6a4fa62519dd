#include "collectives/validation.hpp"

#include <numeric>

#include "quintet/core/error.hpp"

namespace quintet::detail {

namespace {

std::string comm_str(const Communicator& c) {
  return fmt::format("communicator '{}' ({} backend, {} ranks, device {})", c.name(),
                     backend_name(c.backend()), c.size(), c.device().str());
}

// A tensor this communicator can move: defined, contiguous, on the communicator's device.
void check_tensor(const Communicator& c, std::string_view op, std::string_view what,
                  const Tensor& t) {
  QUINTET_CHECK(t.defined(), "{} on {}: {} is an undefined tensor; pass an allocated tensor", op,
                comm_str(c), what);
  QUINTET_CHECK(t.device() == c.device(),
                "{} on {}: {} is on {} but this communicator moves {} tensors; copy it with "
                ".to(Device) or use a communicator made for {}",
                op, comm_str(c), what, t.device().str(), c.device().str(), t.device().str());
  QUINTET_CHECK(t.is_contiguous(),
                "{} on {}: {} ({}) is not contiguous (shape {}, strides {}); pass "
                "tensor.contiguous()",
                op, comm_str(c), what, t.str(), shape_str(t.shape()), shape_str(t.strides()));
}

void check_same_dtype(const Communicator& c, std::string_view op, const Tensor& in,
                      const Tensor& out) {
  QUINTET_CHECK(in.dtype() == out.dtype(),
                "{} on {}: in has dtype {} but out has dtype {}; both must have the same dtype", op,
                comm_str(c), dtype_name(in.dtype()), dtype_name(out.dtype()));
}

void check_reduction(const Communicator& c, std::string_view op, DType dtype, ReduceOp rop) {
  QUINTET_CHECK(reduction_supported(dtype, rop),
                "{} on {}: reduction '{}' is not supported for dtype {} (sum, max, min and prod "
                "work on every dtype but u16; avg needs a floating dtype: f32, f64, f16, bf16); "
                "convert the tensor with .to(DType) first",
                op, comm_str(c), reduce_op_name(rop), dtype_name(dtype));
}

void check_rank(const Communicator& c, std::string_view op, std::string_view what, int r) {
  QUINTET_CHECK(r >= 0 && r < c.size(), "{} on {}: {} {} is out of range; expected 0..{}", op,
                comm_str(c), what, r, c.size() - 1);
}

// Output and input may be the same elements (in place) or disjoint; nothing in between.
void check_alias(const Communicator& c, std::string_view op, const Tensor& in, const Tensor& out,
                 bool allowed, std::string_view in_place_form) {
  if (!tensors_overlap(in, out)) return;
  QUINTET_CHECK(allowed,
                "{} on {}: in ({} elements at offset {}) and out ({} elements at offset {}) "
                "overlap without being the in-place form ({}); use disjoint tensors",
                op, comm_str(c), in.numel(), in.offset(), out.numel(), out.offset(), in_place_form);
}

}  // namespace

bool reduction_supported(DType dtype, ReduceOp op) {
  if (dtype == DType::u16) return false;
  if (op == ReduceOp::avg) return is_floating(dtype);
  return true;
}

bool tensors_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.shares_storage(b)) return false;
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto a0 = static_cast<const char*>(a.data_ptr());
  const auto b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool same_elements(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.data_ptr() == b.data_ptr() && a.numel() == b.numel();
}

bool is_block_of(const Tensor& part, const Tensor& whole, int blocks, int index) {
  if (!part.shares_storage(whole) || part.numel() * blocks != whole.numel()) return false;
  const auto expected = static_cast<const char*>(whole.data_ptr()) + index * part.nbytes();
  return part.data_ptr() == expected;
}

void validate_all_reduce(const Communicator& c, const Tensor& in, const Tensor& out, ReduceOp op) {
  check_tensor(c, "all_reduce", "in", in);
  check_tensor(c, "all_reduce", "out", out);
  check_same_dtype(c, "all_reduce", in, out);
  QUINTET_CHECK(in.numel() == out.numel(),
                "all_reduce on {}: in has {} elements but out has {}; they must be equal",
                comm_str(c), in.numel(), out.numel());
  check_reduction(c, "all_reduce", in.dtype(), op);
  check_alias(c, "all_reduce", in, out, same_elements(in, out), "out is in");
}

void validate_reduce_scatter(const Communicator& c, const Tensor& in, const Tensor& out,
                             ReduceOp op) {
  check_tensor(c, "reduce_scatter", "in", in);
  check_tensor(c, "reduce_scatter", "out", out);
  check_same_dtype(c, "reduce_scatter", in, out);
  QUINTET_CHECK(in.numel() == out.numel() * c.size(),
                "reduce_scatter on {}: in has {} elements but out has {}; in must have size() "
                "* out.numel() = {} elements ({} does not divide into {} blocks of {})",
                comm_str(c), in.numel(), out.numel(), out.numel() * c.size(), in.numel(), c.size(),
                out.numel());
  check_reduction(c, "reduce_scatter", in.dtype(), op);
  check_alias(c, "reduce_scatter", in, out, is_block_of(out, in, c.size(), c.rank()),
              "out is block rank() of in");
}

void validate_all_gather(const Communicator& c, const Tensor& in, const Tensor& out) {
  check_tensor(c, "all_gather", "in", in);
  check_tensor(c, "all_gather", "out", out);
  check_same_dtype(c, "all_gather", in, out);
  QUINTET_CHECK(out.numel() == in.numel() * c.size(),
                "all_gather on {}: in has {} elements but out has {}; out must have size() * "
                "in.numel() = {} elements ({} does not divide into {} blocks of {})",
                comm_str(c), in.numel(), out.numel(), in.numel() * c.size(), out.numel(), c.size(),
                in.numel());
  check_alias(c, "all_gather", in, out, is_block_of(in, out, c.size(), c.rank()),
              "in is block rank() of out");
}

void validate_broadcast(const Communicator& c, const Tensor& inout, int root) {
  check_tensor(c, "broadcast", "inout", inout);
  check_rank(c, "broadcast", "root", root);
}

void validate_reduce(const Communicator& c, const Tensor& in, const Tensor& out, ReduceOp op,
                     int root) {
  check_rank(c, "reduce", "root", root);
  check_tensor(c, "reduce", "in", in);
  check_reduction(c, "reduce", in.dtype(), op);
  if (c.rank() != root) return;
  check_tensor(c, "reduce", "out (on the root)", out);
  check_same_dtype(c, "reduce", in, out);
  QUINTET_CHECK(in.numel() == out.numel(),
                "reduce on {}: in has {} elements but out has {} on the root; they must be equal",
                comm_str(c), in.numel(), out.numel());
  check_alias(c, "reduce", in, out, same_elements(in, out), "out is in");
}

void validate_all_to_all(const Communicator& c, const Tensor& in, const Tensor& out) {
  check_tensor(c, "all_to_all", "in", in);
  check_tensor(c, "all_to_all", "out", out);
  check_same_dtype(c, "all_to_all", in, out);
  QUINTET_CHECK(in.numel() == out.numel() && in.numel() % c.size() == 0,
                "all_to_all on {}: in has {} elements and out has {}; both must have the same "
                "number of elements, divisible by the group size {}",
                comm_str(c), in.numel(), out.numel(), c.size());
  check_alias(c, "all_to_all", in, out, same_elements(in, out), "out is in");
}

void validate_all_to_all_v(const Communicator& c, const Tensor& in,
                           const std::vector<std::int64_t>& send_counts, const Tensor& out,
                           const std::vector<std::int64_t>& recv_counts) {
  check_tensor(c, "all_to_all_v", "in", in);
  check_tensor(c, "all_to_all_v", "out", out);
  check_same_dtype(c, "all_to_all_v", in, out);
  const auto n = static_cast<std::size_t>(c.size());
  QUINTET_CHECK(send_counts.size() == n && recv_counts.size() == n,
                "all_to_all_v on {}: send_counts has {} entries and recv_counts has {}; both "
                "need one count per rank ({})",
                comm_str(c), send_counts.size(), recv_counts.size(), n);
  for (std::size_t j = 0; j < n; ++j) {
    QUINTET_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0,
                  "all_to_all_v on {}: counts for rank {} are send {} / recv {}; counts must "
                  "not be negative",
                  comm_str(c), j, send_counts[j], recv_counts[j]);
  }
  const auto sent = std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  const auto received = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  QUINTET_CHECK(sent == in.numel(),
                "all_to_all_v on {}: send_counts sum to {} but in has {} elements; they must "
                "match",
                comm_str(c), sent, in.numel());
  QUINTET_CHECK(received == out.numel(),
                "all_to_all_v on {}: recv_counts sum to {} but out has {} elements; they must "
                "match",
                comm_str(c), received, out.numel());
  check_alias(c, "all_to_all_v", in, out, same_elements(in, out), "out is in");
}

void validate_send_recv(const Communicator& c, std::string_view op_name, const Tensor& t,
                        int peer) {
  check_tensor(c, op_name, op_name == "send" ? "in" : "out", t);
  check_rank(c, op_name, "peer", peer);
  QUINTET_CHECK(peer != c.rank(),
                "{} on {}: peer {} is this rank; a lone {} to itself can never complete; use "
                "p2p({{send, recv}}) to move data to the same rank",
                op_name, comm_str(c), peer, op_name);
}

void validate_p2p(const Communicator& c, const std::vector<P2POp>& ops) {
  std::vector<std::int64_t> to_self, from_self;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::Kind::send;
    const std::string what = fmt::format("p2p op {} ({})", i, send ? "send" : "recv");
    check_tensor(c, "p2p", what, op.tensor);
    check_rank(c, "p2p", what + " peer", op.peer);
    if (op.peer == c.rank()) (send ? to_self : from_self).push_back(op.tensor.numel());
  }
  QUINTET_CHECK(to_self == from_self,
                "p2p on {}: the sends to this rank itself have sizes [{}] but the receives from "
                "itself have sizes [{}]; each send to self must match a receive from self, in "
                "order",
                comm_str(c), fmt::join(to_self, ", "), fmt::join(from_self, ", "));
}

}  // namespace quintet::detail
