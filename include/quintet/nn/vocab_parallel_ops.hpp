// The ops of a vocabulary split over ranks (tensor parallelism,
// parallel/tensor_parallel/regions.hpp): a masked embedding lookup into one shard of the table, and
// the cross-entropy of logits whose vocabulary dimension is split, computed from per-shard partial
// statistics so the full logits are never gathered. The ops themselves do not communicate: the
// caller moves the partials.
//
// Shard convention: this rank holds vocabulary entries [vocab_start, vocab_start + V_local) of a
// vocabulary of vocab_size entries (V_local = the table's rows, or the logits' last dim).
// Devices, dtypes, streams, accumulation and error rules are those of ops.hpp: CPU f32/f64, CUDA
// bf16/f32 with f32 statistics; parameter gradients accumulate (+=); bad input throws
// InvalidArgument before any work is queued. This header is C++17-clean.
//
// Cross-entropy over tp shards, per token row i (N rows):
//   partials_r = vocab_parallel_ce_partials(logits_r, ...)          // [3, N] on every rank r
//   gathered   = all_gather of partials_r over the ranks, in rank order  // [tp, 3, N]
//   out        = vocab_parallel_ce_combine(gathered, targets, ...)  // == cross_entropy_forward
//   dlogits_r  = vocab_parallel_ce_backward(logits_r, ..., out.lse, out.valid_count, ...)
#pragma once

#include <cstdint>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::nn {

// ---- masked embedding ------------------------------------------------------------------------
// y[..., :] = table_shard[ids[...] - vocab_start, :] for ids in this shard, zero rows for the
// others. ids [...] i32/i64, table_shard [V_local, D] (T). An id outside [0, vocab_size) throws on
// the CPU; on a GPU its row is zero (as in embedding_forward). Returns y [..., D].
Tensor vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table_shard,
                                        std::int64_t vocab_start, std::int64_t vocab_size,
                                        const Stream& stream);
// dtable_shard[ids - vocab_start, :] += dy for the ids in this shard; others are skipped.
// dy [..., D] (T), dtable_shard [V_local, D] f32.
void vocab_parallel_embedding_backward(const Tensor& dy, const Tensor& ids,
                                       const Tensor& dtable_shard, std::int64_t vocab_start,
                                       const Stream& stream);

// ---- cross-entropy over a split vocabulary --------------------------------------------------
// Per-row partial statistics of this shard: returns [3, N] f32 with row 0 = max_j logit_j,
// row 1 = sum_j exp(logit_j - that max) (j over this shard; 0 where the shard's row is all -inf,
// its max -inf, so that a masked shard adds nothing), row 2 = logit[target - vocab_start]
// when the target lies in this shard, else 0. logits_shard [..., V_local] (T), targets [...]
// i32/i64. A target that is neither ignore_index nor in [0, vocab_size) throws on the CPU (before
// anything is computed); on a GPU it counts as ignored.
Tensor vocab_parallel_ce_partials(const Tensor& logits_shard, const Tensor& targets,
                                  std::int64_t vocab_start, std::int64_t vocab_size,
                                  std::int64_t ignore_index, const Stream& stream);
// Merges the partials of all shards ([shards, 3, N] f32, shard order does not matter) into the
// loss of the whole vocabulary: lse = M + log(sum_r s_r exp(m_r - M)) with M = max_r m_r,
// loss = mean over valid tokens of lse - target logit. Same output as cross_entropy_forward on
// the full logits (loss scalar, lse [N], valid_count scalar; accum dtype).
CrossEntropyOutput vocab_parallel_ce_combine(const Tensor& gathered_partials, const Tensor& targets,
                                             std::int64_t vocab_size, std::int64_t ignore_index,
                                             const Stream& stream);
// This shard's part of cross_entropy_backward: dlogits_shard = dloss * (exp(logit - lse) -
// onehot(target - vocab_start)) / max(valid_count, 1), zero rows for ignored tokens. lse and
// valid_count come from vocab_parallel_ce_combine. Returns a tensor like logits_shard (T).
Tensor vocab_parallel_ce_backward(const Tensor& logits_shard, const Tensor& targets,
                                  const Tensor& lse, const Tensor& valid_count, float dloss,
                                  std::int64_t vocab_start, std::int64_t vocab_size,
                                  std::int64_t ignore_index, const Stream& stream);

}  // namespace quintet::nn
