// Attention through cuDNN's graph API (see attention_cudnn.hpp).
//
// cuDNN 9.14 (the GPU machine) and 9.19 (CI) have no single SDPA operation that takes a causal
// mask (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR take masks only as subgraphs from 9.21 and
// the backward one exists from 9.17), so both directions are described as the operation graphs
// that cuDNN's fused flash-attention engines recognise (the graphs cuDNN's frontend builds for
// them). Forward, S = [B, H, Sq, Sk]:
//   S = Q·Kᵀ · scale;  masked: S = (row + shift >= col) ? S : -inf;
//   M = max_j S;  E = exp(S - M);  L = sum_j E;  stats = M + log L (our lse);  O = (E / L)·V
// Backward (flash form, with the out and lse it is given, so merged blocks work):
//   D = rowsum(dO ∘ O);  P = exp(S·scale - lse) masked;  dV = Pᵀ·dO;
//   dS = P ∘ (dO·Vᵀ - D) · scale;  dK = dSᵀ·Q;  dQ = dS·K (accumulated in f32, then cast).
// The shift (q_offset - k_offset) and the scale are by-value scalars, so one plan serves every
// offset of a shape. Grouped-query attention (k, v with Hkv < H heads) is described as cuDNN's
// frontend describes it: the matmuls broadcast each key/value head over its group of query heads
// (K and V read in place), and the backward forms dK and dV per query head in virtual [B, H, Sk, D]
// tensors reduced by addition onto the Hkv heads. Up to cuDNN 9.15 the backward engine needs an
// explicit padding mask (with per-batch sequence lengths) when Sk is not a multiple of 128; it is
// added then.
#include "nn/cudnn/attention_cudnn.hpp"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "nn/cudnn/backend_graph.hpp"
#include "nn/cudnn/cudnn_handles.hpp"
#include "quintet/core/allocator.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/core/error.hpp"

#if CUDNN_VERSION < 90000
#error "Quintet's cuDNN attention needs cuDNN 9"
#endif

namespace quintet::nn::cuda_ops {

namespace {

using cudnn_backend::cudnn_handle;
using cudnn_backend::ExecutionPlan;
using cudnn_backend::Graph;
using Dims = std::vector<std::int64_t>;

// Unique ids of the tensors bound at execution.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kShift,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  kOne,
  kSeqQ,
  kSeqKV,
};

// The tensors of one call whose strides the plan is built for, in this order: the forward's q, k,
// v, out; the backward's q, k, v, out, dout, dq, dk, dv.
enum Operand : int { kOpQ, kOpK, kOpV, kOpO, kOpDO, kOpDQ, kOpDK, kOpDV, kOperands };

// One call's shape, mask and layout. Key j is visible to query i iff !causal or j <= i + shift.
// strides[i]: operand i's strides as [B, H, S, D] (the last is 1): contiguous tensors, or views
// of other layouts such as the heads of a fused [B, S, 3, H, D] projection read in place.
struct Problem {
  std::int64_t b, h, sq, sk, d;
  std::int64_t hk;  // key/value heads, dividing h
  bool causal;
  std::int64_t shift;
  std::vector<Dims> strides;
};

// What a plan depends on: direction, device, stream (its handle), shape, the mask's structure
// (the shift's value is bound at execution) and every operand's strides.
using PlanKey = std::tuple<bool, int, cudnnHandle_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, std::int64_t, std::int64_t, bool, bool, std::vector<Dims>>;

struct CachedPlan {
  std::unique_ptr<const ExecutionPlan> plan;  // null: cuDNN cannot run this shape
  std::string why;                            // why not, when plan is null
  bool padded = false;                        // the backward's padding-mask workaround is in
  std::vector<std::int32_t> seq_lens_host;    // [Sq]*b then [Sk]*b (padded only)
  std::shared_ptr<void> seq_lens;             // their device copy, 16-byte aligned halves
  std::int64_t seq_kv_offset = 0;             // element offset of the Sk half
};

// Process-wide and never destroyed: plans belong to cuDNN handles, which live as long.
struct PlanCache {
  std::mutex mutex;
  std::map<PlanKey, std::shared_ptr<CachedPlan>> plans;
};
PlanCache& plan_cache() {
  static PlanCache* c = new PlanCache;
  return *c;
}

std::size_t runtime_version() { return cudnnGetVersion(); }

// cuDNN before 9.10 wants the largest negative float as the masked score, later ones -inf.
float masked_score() {
  return runtime_version() < 91000 ? std::numeric_limits<float>::lowest()
                                   : -std::numeric_limits<float>::infinity();
}

Dims contiguous_strides(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// Tensors of the SDPA graphs, [B, H, rows, cols] row-major unless said; the operands bound at
// execution have the strides of the call (Problem::strides).
struct Layouts {
  Dims q, score, stat, kv, kt, score_t, kv_full;
  Dims q_s, score_s, stat_s, kv_s, score_t_s, kv_full_s;
  explicit Layouts(const Problem& p) {
    q = {p.b, p.h, p.sq, p.d};
    kv = {p.b, p.hk, p.sk, p.d};
    kt = {p.b, p.hk, p.d, p.sk};      // K (or V) [B, Hkv, Sk, D] seen transposed
    kv_full = {p.b, p.h, p.sk, p.d};  // dK, dV per query head before the sum over each group
    kv_full_s = contiguous_strides(kv_full);
    score = {p.b, p.h, p.sq, p.sk};
    score_t = {p.b, p.h, p.sk, p.sq};
    stat = {p.b, p.h, p.sq, 1};
    q_s = contiguous_strides(q);
    kv_s = contiguous_strides(kv);
    score_s = contiguous_strides(score);
    score_t_s = {p.h * p.sq * p.sk, p.sq * p.sk, 1, p.sk};  // S seen transposed
    stat_s = {p.h * p.sq, p.sq, 1, 1};
  }
};

// The strides of an operand [B, H, S, D] seen transposed, as [B, H, D, S].
Dims transposed(const Dims& s) { return {s[0], s[1], s[3], s[2]}; }

// s with the scores of invisible keys replaced by neg_inf: (row [+ shift] >= col) ? s : neg_inf.
Graph::Tensor causal_mask(Graph& g, const Layouts& l, Graph::Tensor s, Graph::Tensor neg_inf,
                          Graph::Tensor shift) {
  Graph::Tensor row = g.virtual_tensor(CUDNN_DATA_INT32, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, row, 2);
  if (shift != nullptr) {
    Graph::Tensor shifted = g.virtual_tensor(CUDNN_DATA_INT32, l.score, l.score_s);
    g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, row, shift, nullptr, shifted);
    row = shifted;
  }
  Graph::Tensor col = g.virtual_tensor(CUDNN_DATA_INT32, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, col, 3);
  Graph::Tensor keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  Graph::Tensor out = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out);
  return out;
}

// s with rows >= seq_q and columns >= seq_kv (per batch) replaced by neg_inf.
Graph::Tensor padding_mask(Graph& g, const Layouts& l, Graph::Tensor s, Graph::Tensor seq_q,
                           Graph::Tensor seq_kv, Graph::Tensor neg_inf) {
  Graph::Tensor row = g.virtual_tensor(CUDNN_DATA_INT32, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
  Graph::Tensor col = g.virtual_tensor(CUDNN_DATA_INT32, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
  Graph::Tensor row_in = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, seq_q, nullptr, row_in);
  Graph::Tensor col_in = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, seq_kv, nullptr, col_in);
  Graph::Tensor keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, col_in, nullptr, keep);
  Graph::Tensor out = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out);
  return out;
}

const Dims kScalar = {1, 1, 1, 1};

ExecutionPlan build_forward(const Problem& p, cudnnHandle_t handle) {
  const Layouts l(p);
  const std::vector<Dims>& st = p.strides;
  Graph g;
  const auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, l.q, st[kOpQ]);
  const auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, l.kt, transposed(st[kOpK]));
  const auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.kv, st[kOpV]);
  const auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.q, st[kOpO]);
  const auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  const auto scale = g.tensor(kScale, CUDNN_DATA_FLOAT, kScalar, kScalar, true);

  const auto s = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.matmul(q, kt, s);
  auto scaled = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled);
  if (p.causal) {
    const auto neg_inf = g.tensor(kNegInf, CUDNN_DATA_FLOAT, kScalar, kScalar, true);
    const auto shift =
        p.shift != 0 ? g.tensor(kShift, CUDNN_DATA_INT32, kScalar, kScalar, true) : nullptr;
    scaled = causal_mask(g, l, scaled, neg_inf, shift);
  }
  // Softmax with statistics.
  const auto max = g.virtual_tensor(CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  const auto centred = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, max, nullptr, centred);
  const auto e = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centred, nullptr, nullptr, e);
  const auto sum = g.virtual_tensor(CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const auto log_sum = g.virtual_tensor(CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, nullptr, stats);
  const auto probs = g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, nullptr, probs);
  g.matmul(probs, v, o);
  return g.build(handle);
}

ExecutionPlan build_backward(const Problem& p, bool padded, cudnnHandle_t handle) {
  const Layouts l(p);
  const std::vector<Dims>& st = p.strides;
  Graph g;
  const auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, l.q, st[kOpQ]);
  const auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, l.kt, transposed(st[kOpK]));
  const auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.kt, transposed(st[kOpV]));
  const auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.q, st[kOpO]);
  const auto dout = g.tensor(kDO, CUDNN_DATA_BFLOAT16, l.q, st[kOpDO]);
  const auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  const auto dq = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, l.q, st[kOpDQ]);
  const auto dk = g.tensor(kDK, CUDNN_DATA_BFLOAT16, l.kv, st[kOpDK]);
  const auto dv = g.tensor(kDV, CUDNN_DATA_BFLOAT16, l.kv, st[kOpDV]);
  const auto softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  const auto dq_accum = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, l.q, l.q_s);
  const auto scale = g.tensor(kScale, CUDNN_DATA_FLOAT, kScalar, kScalar, true);
  const auto one = g.tensor(kOne, CUDNN_DATA_FLOAT, kScalar, kScalar, true);
  Graph::Tensor neg_inf = nullptr, seq_q = nullptr, seq_kv = nullptr;
  if (p.causal || padded) neg_inf = g.tensor(kNegInf, CUDNN_DATA_FLOAT, kScalar, kScalar, true);
  if (padded) {
    const Dims per_batch = {p.b, 1, 1, 1}, per_batch_s = {1, 1, 1, 1};
    seq_q = g.tensor(kSeqQ, CUDNN_DATA_INT32, per_batch, per_batch_s);
    seq_kv = g.tensor(kSeqKV, CUDNN_DATA_INT32, per_batch, per_batch_s);
  }

  // softmax_sum = rowsum(dO * O) (times the dropout factor cuDNN's graph expects: 1).
  const auto dout_o =
      g.virtual_tensor(CUDNN_DATA_FLOAT, l.q, {p.h * p.sq * p.d, p.sq * p.d, p.h * p.d, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, nullptr, dout_o);
  const auto rowsum = g.virtual_tensor(CUDNN_DATA_FLOAT, l.stat, l.stat_s);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_o, rowsum);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rowsum, one, nullptr, softmax_sum);

  // P = exp(S * scale - lse), masked.
  const auto s = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.matmul(q, kt, s, seq_q, seq_kv, nullptr);
  const auto scaled = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled);
  auto centred = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, stats, nullptr, centred);
  if (padded) centred = padding_mask(g, l, centred, seq_q, seq_kv, neg_inf);
  if (p.causal) {
    const auto shift =
        p.shift != 0 ? g.tensor(kShift, CUDNN_DATA_INT32, kScalar, kScalar, true) : nullptr;
    centred = causal_mask(g, l, centred, neg_inf, shift);
  }
  const auto probs = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centred, nullptr, nullptr, probs);

  // dK or dV of a grouped-query attention: formed per query head into a virtual tensor, then
  // summed over each group of heads into out.
  auto per_query_head = [&](Graph::Tensor out) {
    return p.hk == p.h ? out : g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.kv_full, l.kv_full_s);
  };
  auto sum_groups = [&](Graph::Tensor full, Graph::Tensor out) {
    if (full != out) g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };

  // dV = Pᵀ · dO.
  const auto probs_t = g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.score_t, l.score_t_s);
  g.reshape(probs, probs_t);
  const auto dv_full = per_query_head(dv);
  g.matmul(probs_t, dout, dv_full, seq_kv, nullptr, seq_q);
  sum_groups(dv_full, dv);

  // dS = P * (dO · Vᵀ - softmax_sum) * scale.
  const auto dp = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.matmul(dout, vt, dp, seq_q, seq_kv, nullptr);
  const auto dp_centred = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, softmax_sum, nullptr, dp_centred);
  const auto dp_probs = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_centred, probs, nullptr, dp_probs);
  const auto ds = g.virtual_tensor(CUDNN_DATA_FLOAT, l.score, l.score_s);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_probs, scale, nullptr, ds);

  // dK = dSᵀ · Q.
  const auto ds_t = g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.score_t, l.score_t_s);
  g.reshape(ds, ds_t);
  const auto dk_full = per_query_head(dk);
  g.matmul(ds_t, q, dk_full, seq_kv, nullptr, seq_q);
  sum_groups(dk_full, dk);

  // dQ = dS · K, accumulated in f32.
  const auto k = g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.kv, st[kOpK]);
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum, seq_q, nullptr, seq_kv);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq);
  return g.build(handle);
}

// The options of one call as a Problem, or false with *why set when cuDNN's path does not take it.
// all: the operands in Operand order, then the lse.
bool to_problem(const Tensor& q, const Tensor& k, const AttentionOptions& o,
                const std::vector<const Tensor*>& all, Problem& p, std::string* why) {
  auto reject = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (q.dtype() != DType::bf16) {
    return reject(fmt::format("dtype {}: cuDNN's attention takes bf16", dtype_name(q.dtype())));
  }
  p.b = q.size(0);
  p.h = q.size(1);
  p.hk = k.size(1);
  p.sq = q.size(2);
  p.sk = k.size(2);
  p.d = q.size(3);
  if (p.d != 64 && p.d != 128) {
    return reject(fmt::format("head_dim {}: cuDNN's attention here takes 64 or 128", p.d));
  }
  if (p.b * p.h * p.sq * p.sk == 0) return reject("an empty tensor");
  p.causal = o.causal;
  p.shift = o.causal ? o.q_offset - o.k_offset : 0;  // offsets matter to the causal mask only
  if (p.causal && p.shift < 0) {
    return reject(fmt::format(
        "causal with q_offset {} < k_offset {}: some queries see no key, which cuDNN's softmax "
        "cannot express",
        o.q_offset, o.k_offset));
  }
  if (p.causal && p.shift >= p.sk - 1) {  // every query sees every key: the full mask
    p.causal = false;
    p.shift = 0;
  }
  if (p.shift > std::numeric_limits<std::int32_t>::max()) return reject("offsets beyond int32");
  for (const Tensor* t : all) {
    if (reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) {
      return reject("a tensor not 16-byte aligned");
    }
  }
  // The operands may be strided views; cuDNN reads rows of head_dim contiguous elements, each
  // starting 16-byte aligned. The lse (last) is ours to allocate and is contiguous.
  p.strides.clear();
  for (std::size_t i = 0; i + 1 < all.size(); ++i) {
    const Tensor& t = *all[i];
    if (t.stride(3) != 1) return reject("an operand whose head_dim is not contiguous");
    for (int dim = 0; dim < 3; ++dim) {
      if (t.size(dim) > 1 && t.stride(dim) % 8 != 0) {
        return reject("an operand whose rows do not start 16-byte aligned");
      }
    }
    p.strides.push_back(t.strides());
  }
  if (!all.back()->is_contiguous()) return reject("a strided lse");
  return true;
}

// The cached plan of (direction, stream, problem), built on first use.
std::shared_ptr<CachedPlan> plan_for(bool backward, const Problem& p, const Stream& stream) {
  const cudnnHandle_t handle = cudnn_handle(stream);
  const PlanKey key{backward,     stream.device().index(),
                    handle,       p.b,
                    p.h,          p.hk,
                    p.sq,         p.sk,
                    p.d,          p.causal,
                    p.shift != 0, p.strides};
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return it->second;
  auto entry = std::make_shared<CachedPlan>();
  entry->padded = backward && runtime_version() < 91600 && p.sk % 128 != 0;
  try {
    entry->plan = std::make_unique<const ExecutionPlan>(
        backward ? build_backward(p, entry->padded, handle) : build_forward(p, handle));
  } catch (const Error& e) {
    entry->why = e.what();
  }
  if (entry->plan != nullptr && entry->padded) {
    // Every batch has the full lengths: the mask only tells the engine where the rows end.
    entry->seq_kv_offset = (p.b + 3) / 4 * 4;
    entry->seq_lens_host.assign(static_cast<std::size_t>(2 * entry->seq_kv_offset), 0);
    for (std::int64_t i = 0; i < p.b; ++i) {
      entry->seq_lens_host[i] = static_cast<std::int32_t>(p.sq);
      entry->seq_lens_host[entry->seq_kv_offset + i] = static_cast<std::int32_t>(p.sk);
    }
    const std::size_t bytes = entry->seq_lens_host.size() * sizeof(std::int32_t);
    entry->seq_lens = cuda_allocate(bytes, stream.device(), stream);
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(entry->seq_lens.get(), entry->seq_lens_host.data(), bytes,
                                       cudaMemcpyHostToDevice, stream.handle()));
  }
  return cache.plans.emplace(key, std::move(entry)).first->second;
}

// Device memory for a plan's workspace, on stream (null for none).
std::shared_ptr<void> workspace_for(const ExecutionPlan& plan, const Stream& stream) {
  if (plan.workspace_bytes() <= 0) return nullptr;
  return cuda_allocate(static_cast<std::size_t>(plan.workspace_bytes()), stream.device(), stream);
}

}  // namespace

bool attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& options, const Tensor& out, const Tensor& lse,
                             const Stream& stream, std::string* why) {
  Problem p;
  if (!to_problem(q, k, options, {&q, &k, &v, &out, &lse}, p, why)) return false;
  const std::shared_ptr<CachedPlan> entry = plan_for(false, p, stream);
  if (entry->plan == nullptr) {
    if (why != nullptr) *why = entry->why;
    return false;
  }
  float scale = options.scale, neg_inf = masked_score();
  std::int32_t shift = static_cast<std::int32_t>(p.shift);
  std::vector<std::pair<std::int64_t, void*>> bind = {
      {kQ, q.data_ptr()},   {kK, k.data_ptr()},       {kV, v.data_ptr()},
      {kO, out.data_ptr()}, {kStats, lse.data_ptr()}, {kScale, &scale}};
  if (p.causal) bind.emplace_back(kNegInf, &neg_inf);
  if (p.causal && p.shift != 0) bind.emplace_back(kShift, &shift);
  const std::shared_ptr<void> workspace = workspace_for(*entry->plan, stream);
  entry->plan->execute(cudnn_handle(stream), bind, workspace.get());
  return true;
}

bool attention_backward_cudnn(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                              const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Stream& stream, std::string* why) {
  Problem p;
  if (!to_problem(q, k, options, {&q, &k, &v, &out, &dout, &dq, &dk, &dv, &lse}, p, why)) {
    return false;
  }
  const std::shared_ptr<CachedPlan> entry = plan_for(true, p, stream);
  if (entry->plan == nullptr) {
    if (why != nullptr) *why = entry->why;
    return false;
  }
  const Tensor softmax_sum = Tensor::empty({p.b, p.h, p.sq}, DType::f32, stream.device(), stream);
  const Tensor dq_accum = Tensor::empty(q.shape(), DType::f32, stream.device(), stream);
  if (runtime_version() < 90600) {  // later engines clear their dQ accumulator themselves
    QUINTET_CUDA_CHECK(cudaMemsetAsync(dq_accum.data_ptr(), 0, dq_accum.nbytes(), stream.handle()));
  }
  float scale = options.scale, one = 1.0f, neg_inf = masked_score();
  std::int32_t shift = static_cast<std::int32_t>(p.shift);
  std::vector<std::pair<std::int64_t, void*>> bind = {{kQ, q.data_ptr()},
                                                      {kK, k.data_ptr()},
                                                      {kV, v.data_ptr()},
                                                      {kO, out.data_ptr()},
                                                      {kDO, dout.data_ptr()},
                                                      {kStats, lse.data_ptr()},
                                                      {kDQ, dq.data_ptr()},
                                                      {kDK, dk.data_ptr()},
                                                      {kDV, dv.data_ptr()},
                                                      {kSoftmaxSum, softmax_sum.data_ptr()},
                                                      {kDQAccum, dq_accum.data_ptr()},
                                                      {kScale, &scale},
                                                      {kOne, &one}};
  if (p.causal || entry->padded) bind.emplace_back(kNegInf, &neg_inf);
  if (p.causal && p.shift != 0) bind.emplace_back(kShift, &shift);
  if (entry->padded) {
    auto* lens = static_cast<std::int32_t*>(entry->seq_lens.get());
    bind.emplace_back(kSeqQ, lens);
    bind.emplace_back(kSeqKV, lens + entry->seq_kv_offset);
  }
  const std::shared_ptr<void> workspace = workspace_for(*entry->plan, stream);
  entry->plan->execute(cudnn_handle(stream), bind, workspace.get());
  return true;
}

}  // namespace quintet::nn::cuda_ops
