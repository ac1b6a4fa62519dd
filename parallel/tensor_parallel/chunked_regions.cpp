// The tp region boundaries in chunks (internal/chunked_regions.hpp). Each chunk's rows are laid
// out as the collective wants them ([tp, B, L/k, ...]: block r is rank r's part) before its GEMM,
// so the GEMM writes straight into the buffer that is sent; the results are placed back in
// sequence order by one strided copy per chunk.
#include "parallel/tensor_parallel/internal/chunked_regions.hpp"

#include <memory>
#include <vector>

#include "quintet/core/error.hpp"

namespace quintet::tensor_parallel::detail {

namespace {

std::int64_t inner_of(const Tensor& x) {
  return x.numel() == 0 ? 0 : x.numel() / (x.size(0) * x.size(1));
}

Shape with_dims(const Tensor& x, std::int64_t seq, std::int64_t last) {
  return {x.size(0), seq, last};  // x is [B, seq, F]
}

}  // namespace

void check_chunks(const char* what, const Tensor& x, int chunks) {
  QUINTET_CHECK(chunks >= 1, "{}: overlap_chunks = {} must be >= 1", what, chunks);
  QUINTET_CHECK(x.defined() && x.dim() >= 2, "{}: expected [batch, seq, ...], got {}", what,
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  QUINTET_CHECK(x.size(1) % chunks == 0,
                "{}: the sequence on this rank ({} positions) is not divisible by the tp overlap "
                "chunk count {}; choose a chunk count that divides it (or 1: no chunking)",
                what, x.size(1), chunks);
}

void check_sequence_chunks(const char* what, const Tensor& x, int tp, int chunks) {
  QUINTET_CHECK(chunks >= 1, "{}: overlap_chunks = {} must be >= 1", what, chunks);
  QUINTET_CHECK(x.defined() && x.dim() >= 2, "{}: expected [batch, seq, ...], got {}", what,
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  QUINTET_CHECK(x.size(1) % (static_cast<std::int64_t>(tp) * chunks) == 0,
                "{}: seq = {} is not divisible by tp * overlap chunks = {} * {} (each rank's "
                "sequence part is cut into the chunks); choose a chunk count that divides seq / tp",
                what, x.size(1), tp, chunks);
}

Tensor gather_then_map(const Tensor& x, Communicator& tp, int chunks, const RowMap& f,
                       const Stream& s, Tensor* gathered) {
  check_chunks("gather_then_map", x, chunks);
  QUINTET_CHECK(x.dim() == 3, "gather_then_map: expected [batch, seq/tp, features], got {}",
                shape_str(x.shape()));
  const int n = tp.size();
  const std::int64_t b = x.size(0), c = x.size(1) / chunks, feat = inner_of(x);
  const Tensor xc = x.contiguous(s).view({b, chunks, c, feat});
  std::vector<Tensor> in(static_cast<std::size_t>(chunks)), got(in.size());
  Tensor y, full;
  if (gathered != nullptr) full = Tensor::empty({b, n, chunks, c, feat}, x.dtype(), x.device(), s);
  overlap::ChunkStages stages;
  stages.lookahead = 0;  // every piece on its way at once: the gathered input is kept anyway
  stages.bring = [&](int j) {
    const auto i = static_cast<std::size_t>(j);
    in[i] = xc.slice(1, j, j + 1).contiguous(s);
    got[i] = Tensor::empty({n, b, c, feat}, x.dtype(), x.device(), s);
    return tp.all_gather(in[i], got[i], s);
  };
  stages.compute = [&](int j) {
    const Tensor& g = got[static_cast<std::size_t>(j)];
    const Tensor yj = f(g.view({n * b * c, feat}));
    const std::int64_t out = yj.size(1);
    if (!y.defined()) y = Tensor::empty({b, n, chunks, c, out}, yj.dtype(), yj.device(), s);
    y.slice(2, j, j + 1).copy_(yj.view({n, b, 1, c, out}).transpose(0, 1), s);
    if (full.defined())
      full.slice(2, j, j + 1).copy_(g.view({n, b, 1, c, feat}).transpose(0, 1), s);
  };
  overlap::ChunkPipeline::run(chunks, stages, s).finish(s);
  const std::int64_t seq = n * chunks * c;
  if (gathered != nullptr) {
    Shape shape = x.shape();
    shape[1] = seq;
    *gathered = full.view(shape);
  }
  return y.view(with_dims(x, seq, y.size(4)));
}

ChunkedPending map_then_reduce_scatter(const Tensor& x, Communicator& tp, int chunks,
                                       const RowMap& f, const Stream& s) {
  const int n = tp.size();
  check_sequence_chunks("map_then_reduce_scatter", x, n, chunks);
  QUINTET_CHECK(x.dim() == 3, "map_then_reduce_scatter: expected [batch, seq, features], got {}",
                shape_str(x.shape()));
  const std::int64_t b = x.size(0), c = x.size(1) / n / chunks, feat = inner_of(x);
  struct State {
    Tensor xc, out;
    std::vector<Tensor> part, reduced;
  };
  auto st = std::make_shared<State>();
  st->xc = x.contiguous(s).view({b, n, chunks, c, feat});
  st->part.resize(static_cast<std::size_t>(chunks));
  st->reduced.resize(st->part.size());
  overlap::ChunkStages stages;
  stages.compute = [&](int j) {
    const Tensor rows = st->xc.slice(2, j, j + 1).transpose(0, 1).contiguous(s);  // [n, b, 1, c, F]
    Tensor p = f(rows.view({n * b * c, feat}));
    if (!st->out.defined())
      st->out = Tensor::empty({b, chunks, c, p.size(1)}, p.dtype(), p.device(), s);
    st->part[static_cast<std::size_t>(j)] = std::move(p);
  };
  stages.send = [&](int j) {
    const auto i = static_cast<std::size_t>(j);
    st->reduced[i] = Tensor::empty({b, c, st->out.size(3)}, x.dtype(), x.device(), s);
    return tp.reduce_scatter(st->part[i], st->reduced[i], ReduceOp::sum, s);
  };
  stages.arrived = [st, b, c](int j, const Stream& on) {
    const auto i = static_cast<std::size_t>(j);
    st->out.slice(1, j, j + 1).copy_(st->reduced[i].view({b, 1, c, st->out.size(3)}), on);
    st->part[i] = Tensor();
    st->reduced[i] = Tensor();
  };
  ChunkedPending pending;
  pending.sent = overlap::ChunkPipeline::run(chunks, stages, s);
  pending.value = st->out.view(with_dims(x, chunks * c, st->out.size(3)));
  return pending;
}

ChunkedPending map_then_all_reduce(const Tensor& x, Communicator& tp, int chunks, const RowMap& f,
                                   const Stream& s) {
  check_chunks("map_then_all_reduce", x, chunks);
  const std::int64_t feat = x.size(x.dim() - 1), rows = x.numel() / feat, m = rows / chunks;
  const Tensor x2 = x.contiguous(s).view({rows, feat});
  std::vector<Tensor> part(static_cast<std::size_t>(chunks));
  Tensor out;
  overlap::ChunkStages stages;
  stages.compute = [&](int j) {
    Tensor p = f(x2.narrow(0, j * m, m));
    if (!out.defined()) out = Tensor::empty({rows, p.size(1)}, p.dtype(), p.device(), s);
    part[static_cast<std::size_t>(j)] = std::move(p);
  };
  stages.send = [&](int j) {
    return tp.all_reduce(part[static_cast<std::size_t>(j)], out.narrow(0, j * m, m), ReduceOp::sum,
                         s);
  };
  ChunkedPending pending;
  pending.sent = overlap::ChunkPipeline::run(chunks, stages, s);
  Shape shape = x.shape();
  shape.back() = out.size(1);
  pending.value = out.view(shape);
  return pending;
}

}  // namespace quintet::tensor_parallel::detail
