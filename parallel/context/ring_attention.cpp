// Context-parallel attention: ring and all-to-all (see ring_attention.hpp).
#include "quintet/parallel/context/ring_attention.hpp"

#include <limits>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/parallel/overlap/chunk_pipeline.hpp"

namespace quintet::context {

namespace {

// The two chunks of a local sequence of 2c along dim.
Tensor chunk_of(const Tensor& t, int dim, int j, std::int64_t c) { return t.narrow(dim, j * c, c); }

// The global start of chunk j (0: the early one, 1: the late one) of rank `owner`.
std::int64_t chunk_start(int owner, int j, int cp, std::int64_t c) {
  return (j == 0 ? owner : 2 * cp - 1 - owner) * c;
}

// Checks q [B, H, 2c, D] and k, v [B, Hkv, 2c, D] (H a multiple of Hkv) of one dtype; returns c.
std::int64_t check_local(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  QUINTET_CHECK(q.defined() && q.dim() == 4,
                "{}: q must be [batch, heads, local seq, head_dim], found {}", op,
                q.defined() ? shape_str(q.shape()) : std::string("undefined"));
  const Shape kv_shape{q.size(0), k.defined() && k.dim() == 4 ? k.size(1) : 0, q.size(2),
                       q.size(3)};
  QUINTET_CHECK(k.defined() && v.defined() && k.shape() == kv_shape && v.shape() == kv_shape &&
                    kv_shape[1] > 0 && q.size(1) % kv_shape[1] == 0 && k.dtype() == q.dtype() &&
                    v.dtype() == q.dtype(),
                "{}: k and v must be [batch, kv heads, local seq, head_dim] with q's sizes {} but "
                "kv heads dividing its heads, and q's dtype (self-attention of one sequence); "
                "found k {}, v {}",
                op, shape_str(q.shape()),
                k.defined() ? shape_str(k.shape()) : std::string("undefined"),
                v.defined() ? shape_str(v.shape()) : std::string("undefined"));
  QUINTET_CHECK(q.size(2) % 2 == 0,
                "{}: the local sequence of {} tokens is not two chunks; split the sequence with "
                "cp_split (2 * cp chunks)",
                op, q.size(2));
  return q.size(2) / 2;
}

nn::AttentionOptions block_options(const CpAttentionOptions& o, std::int64_t q_start,
                                   std::int64_t k_start) {
  nn::AttentionOptions b;
  // Chunks are aligned: a key chunk that starts before the query chunk is seen whole (no mask),
  // the same chunk is the causal diagonal, a later one is masked whole (never called).
  b.causal = o.causal && k_start == q_start;
  b.q_offset = q_start;
  b.k_offset = k_start;
  b.scale = o.scale;
  return b;
}

bool visible(const CpAttentionOptions& o, std::int64_t q_start, std::int64_t k_start) {
  return !o.causal || k_start <= q_start;
}

// K and V of one rank packed as [2 (k, v), 2 (chunk), B, H, c, D], so that one transfer moves
// them and each block is a contiguous view.
Tensor part(const Tensor& packed, int which, int j) {
  const Shape& s = packed.shape();
  return packed.narrow(0, which, 1).narrow(1, j, 1).view({s[2], s[3], s[4], s[5]});
}

Tensor pack_kv(const Tensor& k, const Tensor& v, std::int64_t c, const Stream& stream) {
  Tensor packed =
      Tensor::empty({2, 2, k.size(0), k.size(1), c, k.size(3)}, k.dtype(), k.device(), stream);
  for (int j = 0; j < 2; ++j) {
    part(packed, 0, j).copy_(chunk_of(k, 2, j, c), stream);
    part(packed, 1, j).copy_(chunk_of(v, 2, j, c), stream);
  }
  return packed;
}

// A tensor of value, made on stream (the compute streams do not wait for the legacy default one).
Tensor filled(const Shape& shape, DType dtype, const Device& device, double value,
              const Stream& stream) {
  Tensor t = Tensor::empty(shape, dtype, device, stream);
  t.fill_(value, stream);
  return t;
}

// The two chunks a and b joined along dim 2 (as dtype).
Tensor join(const Tensor& a, const Tensor& b, DType dtype, const Stream& stream) {
  Shape s = a.shape();
  s[2] *= 2;
  Tensor out = Tensor::empty(s, dtype, a.device(), stream);
  out.narrow(2, 0, a.size(2)).copy_(a, stream);
  out.narrow(2, a.size(2), a.size(2)).copy_(b, stream);
  return out;
}

}  // namespace

ContextParallelKind parse_context_parallel_kind(std::string_view name) {
  if (name == "ring") return ContextParallelKind::ring;
  if (name == "ulysses" || name == "all-to-all") return ContextParallelKind::all_to_all;
  QUINTET_THROW(InvalidArgument, "unknown context-parallel kind \"{}\"; use ring or ulysses", name);
}

void check_cp_sequence(std::int64_t seq, int cp) {
  QUINTET_CHECK(cp >= 1 && seq > 0 && seq % (2 * cp) == 0,
                "context parallelism: the sequence of {} tokens must split into 2 * cp = {} equal "
                "chunks (cp {}); use a sequence length that is a multiple of {}",
                seq, 2 * cp, cp, 2 * cp);
}

Tensor cp_split(const Tensor& full, int dim, int cp, int rank, const Stream& stream) {
  QUINTET_CHECK(dim >= 0 && dim < full.dim(), "cp_split: dim {} of a {}-d tensor", dim, full.dim());
  QUINTET_CHECK(rank >= 0 && rank < cp, "cp_split: rank {} of cp {}", rank, cp);
  check_cp_sequence(full.size(dim), cp);
  const std::int64_t c = full.size(dim) / (2 * cp);
  Shape s = full.shape();
  s[dim] = 2 * c;
  Tensor out = Tensor::empty(s, full.dtype(), full.device(), stream);
  for (int j = 0; j < 2; ++j) {
    out.narrow(dim, j * c, c).copy_(full.narrow(dim, chunk_start(rank, j, cp, c), c), stream);
  }
  return out;
}

Tensor cp_gather(Communicator& cp, const Tensor& local, int dim, const Stream& stream) {
  const int n = cp.size();
  QUINTET_CHECK(dim >= 0 && dim < local.dim() && local.size(dim) % 2 == 0,
                "cp_gather: dim {} of {} is not a local sequence of two chunks", dim,
                shape_str(local.shape()));
  const std::int64_t c = local.size(dim) / 2;
  const Tensor mine = local.contiguous(stream);
  Tensor all = Tensor::empty({n * mine.numel()}, mine.dtype(), mine.device(), stream);
  cp.all_gather(mine.view({mine.numel()}), all, stream).wait(stream);
  Shape s = local.shape();
  s[dim] = 2 * c * n;
  Tensor full = Tensor::empty(s, local.dtype(), local.device(), stream);
  for (int r = 0; r < n; ++r) {
    const Tensor piece = all.narrow(0, r * mine.numel(), mine.numel()).view(local.shape());
    for (int j = 0; j < 2; ++j) {
      full.narrow(dim, chunk_start(r, j, n, c), c).copy_(piece.narrow(dim, j * c, c), stream);
    }
  }
  return full;
}

std::vector<std::int64_t> cp_positions(std::int64_t seq, int cp, int rank) {
  check_cp_sequence(seq, cp);
  const std::int64_t c = seq / (2 * cp);
  std::vector<std::int64_t> out;
  for (int j = 0; j < 2; ++j) {
    for (std::int64_t i = 0; i < c; ++i) out.push_back(chunk_start(rank, j, cp, c) + i);
  }
  return out;
}

namespace {

// The second K/V buffer of the ring (none at one rank): step t's block lands in kv[t % 2].
Tensor ring_buffer(const Tensor& packed, int n, const Stream& stream) {
  return n == 1 ? Tensor() : Tensor::empty(packed.shape(), packed.dtype(), packed.device(), stream);
}

// Step t's K/V block: none to move at step 0 (this rank's own); then one hop of the ring, passing
// on step t - 1's block and receiving step t's. Issued one step ahead (ChunkPipeline's lookahead
// 1), under step t - 1's attention; the communicator runs it after the hop that brought t - 1.
Work ring_hop(Communicator& cp, const Tensor (&kv)[2], int t, const Stream& stream) {
  if (t == 0) return Work();
  const int n = cp.size(), r = cp.rank();
  return cp.p2p(
      {P2POp::send(kv[(t - 1) % 2], (r + 1) % n), P2POp::recv(kv[t % 2], (r - 1 + n) % n)}, stream);
}

}  // namespace

nn::AttentionOutput ring_attention_forward(Communicator& cp, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const CpAttentionOptions& options,
                                           const Stream& stream) {
  const std::int64_t c = check_local("ring_attention_forward", q, k, v);
  const int n = cp.size(), r = cp.rank();
  const DType stats = nn::accum_dtype(q.dtype());
  const Tensor qs[2] = {chunk_of(q, 2, 0, c).contiguous(stream),
                        chunk_of(q, 2, 1, c).contiguous(stream)};
  Tensor out[2], lse[2];
  for (int i = 0; i < 2; ++i) {
    out[i] = filled(qs[i].shape(), q.dtype(), q.device(), 0.0, stream);
    lse[i] = filled({q.size(0), q.size(1), c}, stats, q.device(),
                    -std::numeric_limits<double>::infinity(), stream);
  }
  const Tensor packed = pack_kv(k, v, c, stream);
  const Tensor kv[2] = {packed, ring_buffer(packed, n, stream)};
  overlap::ChunkStages steps;  // step t attends to the K/V block of rank r - t
  steps.bring = [&](int t) { return ring_hop(cp, kv, t, stream); };
  steps.compute = [&](int t) {
    const Tensor& cur = kv[t % 2];
    const int owner = (r - t + n) % n;
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        const std::int64_t qs0 = chunk_start(r, i, n, c), ks0 = chunk_start(owner, j, n, c);
        if (!visible(options, qs0, ks0)) continue;
        const nn::AttentionOutput b = nn::attention_forward(
            qs[i], part(cur, 0, j), part(cur, 1, j), block_options(options, qs0, ks0), stream);
        nn::attention_merge_(out[i], lse[i], b.out, b.lse, stream);
      }
    }
  };
  overlap::ChunkPipeline::run(n, steps, stream).finish(stream);
  return {join(out[0], out[1], q.dtype(), stream), join(lse[0], lse[1], stats, stream)};
}

nn::AttentionGrads ring_attention_backward(Communicator& cp, const Tensor& dout, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse, const CpAttentionOptions& options,
                                           const Stream& stream) {
  const std::int64_t c = check_local("ring_attention_backward", q, k, v);
  QUINTET_CHECK(dout.defined() && out.defined() && dout.shape() == q.shape() &&
                    out.shape() == q.shape() && lse.defined() &&
                    lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}),
                "ring_attention_backward: dout and out must be {} and lse [{}, {}, {}] (the "
                "forward's)",
                shape_str(q.shape()), q.size(0), q.size(1), q.size(2));
  const int n = cp.size(), r = cp.rank();
  const DType acc = nn::accum_dtype(q.dtype());
  Tensor qs[2], douts[2], outs[2], lses[2], dq[2];
  for (int i = 0; i < 2; ++i) {
    qs[i] = chunk_of(q, 2, i, c).contiguous(stream);
    douts[i] = chunk_of(dout, 2, i, c).contiguous(stream);
    outs[i] = chunk_of(out, 2, i, c).contiguous(stream);
    lses[i] = lse.narrow(2, i * c, c).contiguous(stream);
    dq[i] = filled(qs[i].shape(), acc, q.device(), 0.0, stream);
  }
  const Tensor packed = pack_kv(k, v, c, stream);
  const Tensor kv[2] = {packed, ring_buffer(packed, n, stream)};
  // The gradients of the K/V block in hand, travelling with it (f32 accumulators).
  Tensor dkv = filled(kv[0].shape(), acc, q.device(), 0.0, stream);
  Tensor dkv_next = n > 1 ? Tensor::empty(dkv.shape(), acc, q.device(), stream) : Tensor();
  overlap::ChunkStages steps;
  steps.bring = [&](int t) { return ring_hop(cp, kv, t, stream); };
  steps.compute = [&](int t) {
    const Tensor& cur = kv[t % 2];
    const int owner = (r - t + n) % n;
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        const std::int64_t qs0 = chunk_start(r, i, n, c), ks0 = chunk_start(owner, j, n, c);
        if (!visible(options, qs0, ks0)) continue;
        const nn::AttentionGrads g =
            nn::attention_backward(douts[i], qs[i], part(cur, 0, j), part(cur, 1, j), outs[i],
                                   lses[i], block_options(options, qs0, ks0), stream);
        nn::add_(dq[i], g.dq, 1.0f, stream);
        nn::add_(part(dkv, 0, j), g.dk, 1.0f, stream);
        nn::add_(part(dkv, 1, j), g.dv, 1.0f, stream);
      }
    }
    // One hop on: the next rank holds this K/V block at the next step, and after the last step
    // the hop brings each block's gradients home. The next step adds to them: not overlapped.
    if (n > 1) {
      cp.p2p({P2POp::send(dkv, (r + 1) % n), P2POp::recv(dkv_next, (r - 1 + n) % n)}, stream)
          .wait(stream);
      std::swap(dkv, dkv_next);
    }
  };
  overlap::ChunkPipeline::run(n, steps, stream).finish(stream);
  return {join(dq[0], dq[1], q.dtype(), stream),
          join(part(dkv, 0, 0), part(dkv, 0, 1), q.dtype(), stream),
          join(part(dkv, 1, 0), part(dkv, 1, 1), q.dtype(), stream)};
}

namespace {

// How many times each K/V head is repeated before the exchange (1: split as they are).
std::int64_t kv_repeats(std::int64_t kv_heads, int cp) {
  return kv_heads % cp == 0 ? 1 : cp / kv_heads;
}

// k [B, Hkv, L, D] with each head repeated r times in place: [B, Hkv * r, L, D].
Tensor repeat_heads(const Tensor& k, std::int64_t r, const Stream& stream) {
  if (r == 1) return k;
  const std::int64_t b = k.size(0), h = k.size(1), l = k.size(2), d = k.size(3);
  Tensor out = Tensor::empty({b, h, r, l, d}, k.dtype(), k.device(), stream);
  const Tensor one = k.contiguous(stream).view({b, h, 1, l, d});
  for (std::int64_t j = 0; j < r; ++j) out.narrow(2, j, 1).copy_(one, stream);
  return out.view({b, h * r, l, d});
}

// The inverse's gradient: [B, Hkv * r, L, D] summed over each head's r repeats.
Tensor sum_repeats(const Tensor& g, std::int64_t r, const Stream& stream) {
  if (r == 1) return g;
  const std::int64_t b = g.size(0), h = g.size(1) / r, l = g.size(2), d = g.size(3);
  const Tensor groups = g.contiguous(stream).view({b, h, r, l, d});
  Tensor out = groups.narrow(2, 0, 1).contiguous(stream);
  for (std::int64_t j = 1; j < r; ++j) {
    nn::add_(out, groups.narrow(2, j, 1).contiguous(stream), 1.0f, stream);
  }
  return out.view({b, h, l, d});
}

// [B, H, 2c, D] in the cp layout -> [B, H/cp, S, D] (this rank's heads, the whole sequence).
Tensor to_heads(Communicator& cp, const Tensor& x, const Stream& stream) {
  const int n = cp.size();
  const std::int64_t b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3), g = h / n;
  const std::int64_t c = l / 2;
  const Tensor send = x.contiguous(stream).view({b, n, g, l, d}).transpose(0, 1).contiguous(stream);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device(), stream);
  cp.all_to_all(send, recv, stream).wait(stream);
  Tensor full = Tensor::empty({b, g, l * n, d}, x.dtype(), x.device(), stream);
  for (int s = 0; s < n; ++s) {
    const Tensor piece = recv.narrow(0, s, 1).view({b, g, l, d});
    for (int j = 0; j < 2; ++j) {
      full.narrow(2, chunk_start(s, j, n, c), c).copy_(piece.narrow(2, j * c, c), stream);
    }
  }
  return full;
}

// The inverse: [B, H/cp, S, D] -> [B, H, 2c, D] in the cp layout.
Tensor to_sequence(Communicator& cp, const Tensor& y, const Stream& stream) {
  const int n = cp.size();
  const std::int64_t b = y.size(0), g = y.size(1), d = y.size(3);
  const std::int64_t c = y.size(2) / (2 * n), l = 2 * c;
  Tensor send = Tensor::empty({n, b, g, l, d}, y.dtype(), y.device(), stream);
  for (int s = 0; s < n; ++s) {
    Tensor dst = send.narrow(0, s, 1).view({b, g, l, d});
    for (int j = 0; j < 2; ++j) {
      dst.narrow(2, j * c, c).copy_(y.narrow(2, chunk_start(s, j, n, c), c), stream);
    }
  }
  Tensor recv = Tensor::empty(send.shape(), y.dtype(), y.device(), stream);
  cp.all_to_all(send, recv, stream).wait(stream);
  return recv.transpose(0, 1).contiguous(stream).view({b, g * n, l, d});
}

}  // namespace

void check_ulysses_heads(const char* where, std::int64_t heads, std::int64_t kv_heads, int cp,
                         const std::string& from) {
  const std::string numbers = from.empty() ? std::string() : " (" + from + ")";
  QUINTET_CHECK(cp >= 1 && heads > 0 && heads % cp == 0,
                "{}: all-to-all attention splits the {} local query heads{} (after tensor "
                "parallelism) over cp {}, which does not divide them; use ring attention or a "
                "head count divisible by cp",
                where, heads, numbers, cp);
  QUINTET_CHECK(kv_heads > 0 && heads % kv_heads == 0 && (kv_heads % cp == 0 || cp % kv_heads == 0),
                "{}: all-to-all attention splits the {} local key/value heads{} over cp {} with "
                "their query heads: cp must divide them, or be a multiple of them (each then "
                "repeated to every rank that reads it); neither holds, so use ring attention or "
                "another kv_heads",
                where, kv_heads, numbers, cp);
}

UlyssesOutput ulysses_attention_forward(Communicator& cp, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const CpAttentionOptions& options,
                                        const Stream& stream) {
  check_local("ulysses_attention_forward", q, k, v);
  check_ulysses_heads("ulysses_attention_forward", q.size(1), k.size(1), cp.size());
  const std::int64_t r_kv = kv_repeats(k.size(1), cp.size());
  UlyssesOutput r;
  r.saved.kv_heads = k.size(1);
  r.saved.q = to_heads(cp, q, stream);
  r.saved.k = to_heads(cp, repeat_heads(k, r_kv, stream), stream);
  r.saved.v = to_heads(cp, repeat_heads(v, r_kv, stream), stream);
  nn::AttentionOptions o;
  o.causal = options.causal;
  o.scale = options.scale;
  nn::AttentionOutput a = nn::attention_forward(r.saved.q, r.saved.k, r.saved.v, o, stream);
  r.out = to_sequence(cp, a.out, stream);
  r.saved.out = std::move(a.out);
  r.saved.lse = std::move(a.lse);
  return r;
}

nn::AttentionGrads ulysses_attention_backward(Communicator& cp, const Tensor& dout,
                                              const UlyssesSaved& saved,
                                              const CpAttentionOptions& options,
                                              const Stream& stream) {
  QUINTET_CHECK(saved.q.defined() && dout.defined() && dout.dim() == 4 &&
                    dout.size(1) == saved.q.size(1) * cp.size(),
                "ulysses_attention_backward: dout {} does not match the forward's saved q {}",
                dout.defined() ? shape_str(dout.shape()) : std::string("undefined"),
                saved.q.defined() ? shape_str(saved.q.shape()) : std::string("undefined"));
  nn::AttentionOptions o;
  o.causal = options.causal;
  o.scale = options.scale;
  const std::int64_t kv_heads = saved.kv_heads > 0 ? saved.kv_heads : dout.size(1);
  QUINTET_CHECK(saved.k.defined() &&
                    saved.k.size(1) * cp.size() == kv_heads * kv_repeats(kv_heads, cp.size()),
                "ulysses_attention_backward: the saved k {} does not hold {} key/value heads "
                "split over cp {}",
                saved.k.defined() ? shape_str(saved.k.shape()) : std::string("undefined"), kv_heads,
                cp.size());
  const std::int64_t r_kv = kv_repeats(kv_heads, cp.size());
  const Tensor dfull = to_heads(cp, dout, stream);
  const nn::AttentionGrads g =
      nn::attention_backward(dfull, saved.q, saved.k, saved.v, saved.out, saved.lse, o, stream);
  return {to_sequence(cp, g.dq, stream), sum_repeats(to_sequence(cp, g.dk, stream), r_kv, stream),
          sum_repeats(to_sequence(cp, g.dv, stream), r_kv, stream)};
}

}  // namespace quintet::context
