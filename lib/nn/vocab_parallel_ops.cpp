// The device dispatch of quintet/nn/vocab_parallel_ops.hpp: check every argument, allocate the
// outputs, then call the CPU (lib/nn/cpu/vocab_parallel.cpp) or CUDA
// (lib/nn/cuda/vocab_parallel.cu) implementation, as ops.cpp does.
#include "quintet/nn/vocab_parallel_ops.hpp"

#include <cmath>

#include "nn/op_checks.hpp"
#include "nn/op_dispatch.hpp"
#include "nn/vocab_parallel_impl.hpp"

namespace quintet::nn {

using detail::OpChecker;

namespace {

void check_shard(const OpChecker& c, std::int64_t local, std::int64_t vocab_start,
                 std::int64_t vocab_size) {
  QUINTET_CHECK(vocab_start >= 0 && local > 0 && vocab_start + local <= vocab_size,
                "{}: the shard [{}, {}) is not a non-empty part of the vocabulary [0, {})", c.op(),
                vocab_start, vocab_start + local, vocab_size);
}

}  // namespace

Tensor vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table_shard,
                                        std::int64_t vocab_start, std::int64_t vocab_size,
                                        const Stream& stream) {
  const OpChecker c("vocab_parallel_embedding_forward", stream);
  c.ids("ids", ids);
  const DType t = c.compute("table_shard", table_shard);
  QUINTET_CHECK(table_shard.dim() == 2,
                "vocab_parallel_embedding_forward: table_shard has shape {}, expected [rows, dim]",
                shape_str(table_shard.shape()));
  check_shard(c, table_shard.size(0), vocab_start, vocab_size);
  const Tensor idc = ids.contiguous(stream).view({ids.numel()});
  const Tensor tc = table_shard.contiguous(stream);
  Tensor y = Tensor::empty({ids.numel(), table_shard.size(1)}, t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_embedding_forward, idc, tc, vocab_start, vocab_size,
                      y);
  Shape out = ids.shape();
  out.push_back(table_shard.size(1));
  return y.view(out);
}

void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids,
                                       const Tensor& dtable_shard, std::int64_t vocab_start,
                                       const Stream& stream) {
  const OpChecker c("vocab_parallel_embedding_backward", stream);
  c.ids("ids", ids);
  const DType t = c.compute("dy", dy);
  QUINTET_CHECK(dtable_shard.dim() == 2,
                "vocab_parallel_embedding_backward: dtable_shard has shape {}, expected [rows, "
                "dim]",
                shape_str(dtable_shard.shape()));
  QUINTET_CHECK(vocab_start >= 0, "vocab_parallel_embedding_backward: vocab_start = {} < 0",
                vocab_start);
  c.accumulator("dtable_shard", dtable_shard, t, dtable_shard.shape());
  Shape expected = ids.shape();
  expected.push_back(dtable_shard.size(1));
  c.shape("dy", dy, expected);
  const Tensor idc = ids.contiguous(stream).view({ids.numel()});
  const Tensor dyc = dy.contiguous(stream).view({ids.numel(), dtable_shard.size(1)});
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_embedding_backward, dyc, idc, dtable_shard,
                      vocab_start);
}

Tensor vocab_parallel_ce_partials(const Tensor& logits_shard, const Tensor& targets,
                                  std::int64_t vocab_start, std::int64_t vocab_size,
                                  std::int64_t ignore_index, const Stream& stream) {
  const OpChecker c("vocab_parallel_ce_partials", stream);
  const DType t = c.compute("logits_shard", logits_shard);
  check_shard(c, c.last_dim("logits_shard", logits_shard), vocab_start, vocab_size);
  check_targets(c, logits_shard, targets);
  const Tensor l2 = detail::as_rows(logits_shard, stream);
  const Tensor tc = targets.contiguous(stream).view({targets.numel()});
  Tensor partials = Tensor::empty({3, l2.size(0)}, accum_dtype(t), c.device(), stream);
  QUINTET_NN_DISPATCH_ARGS(c, vocab_parallel_ce_partials,
                           (c.op(), l2, tc, vocab_start, vocab_size, ignore_index, partials),
                           (l2, tc, vocab_start, vocab_size, ignore_index, partials, stream));
  return partials;
}

CrossEntropyOutput vocab_parallel_ce_combine(const Tensor& gathered_partials, const Tensor& targets,
                                             std::int64_t vocab_size, std::int64_t ignore_index,
                                             const Stream& stream) {
  const OpChecker c("vocab_parallel_ce_combine", stream);
  c.on_device("gathered_partials", gathered_partials);
  c.ids("targets", targets);
  const DType a = gathered_partials.dtype();
  QUINTET_CHECK((a == DType::f32 || (a == DType::f64 && !c.on_cuda())) &&
                    gathered_partials.dim() == 3 && gathered_partials.size(0) >= 1 &&
                    gathered_partials.size(1) == 3 && gathered_partials.size(2) == targets.numel(),
                "vocab_parallel_ce_combine: gathered_partials is {}, expected the partials of "
                "every shard, [shards, 3, {}] f32, for targets of shape {}",
                gathered_partials.str(), targets.numel(), shape_str(targets.shape()));
  QUINTET_CHECK(vocab_size > 0, "vocab_parallel_ce_combine: vocab_size = {} must be > 0",
                vocab_size);
  const Tensor gc = gathered_partials.contiguous(stream);
  const Tensor tc = targets.contiguous(stream).view({targets.numel()});
  CrossEntropyOutput o{Tensor::empty({}, a, c.device(), stream),
                       Tensor::empty({targets.numel()}, a, c.device(), stream),
                       Tensor::empty({}, a, c.device(), stream)};
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_ce_combine, gc, tc, vocab_size, ignore_index,
                      o.loss, o.lse, o.valid_count);
  return o;
}

Tensor vocab_parallel_ce_backward(const Tensor& logits_shard, const Tensor& targets,
                                  const Tensor& lse, const Tensor& valid_count, float dloss,
                                  std::int64_t vocab_start, std::int64_t vocab_size,
                                  std::int64_t ignore_index, const Stream& stream) {
  const OpChecker c("vocab_parallel_ce_backward", stream);
  const DType t = c.compute("logits_shard", logits_shard);
  check_shard(c, c.last_dim("logits_shard", logits_shard), vocab_start, vocab_size);
  check_targets(c, logits_shard, targets);
  const Tensor l2 = detail::as_rows(logits_shard, stream);
  const DType a = accum_dtype(t);
  c.on_device("lse", lse);
  c.on_device("valid_count", valid_count);
  QUINTET_CHECK(lse.dtype() == a && lse.numel() == l2.size(0),
                "vocab_parallel_ce_backward: lse is {}, expected the combine's {} with {} elements",
                lse.str(), dtype_name(a), l2.size(0));
  QUINTET_CHECK(valid_count.dtype() == a && valid_count.numel() == 1,
                "vocab_parallel_ce_backward: valid_count is {}, expected the combine's {} scalar",
                valid_count.str(), dtype_name(a));
  QUINTET_CHECK(std::isfinite(dloss), "vocab_parallel_ce_backward: dloss = {} is not finite",
                dloss);
  const Tensor tc = targets.contiguous(stream).view({targets.numel()});
  const Tensor lc = lse.contiguous(stream), vc = valid_count.contiguous(stream);
  Tensor dl = Tensor::empty(l2.shape(), t, c.device(), stream);
  QUINTET_NN_DISPATCH(c, stream, vocab_parallel_ce_backward, l2, tc, lc, vc, dloss, vocab_start,
                      vocab_size, ignore_index, dl);
  return dl.view(logits_shard.shape());
}

}  // namespace quintet::nn
