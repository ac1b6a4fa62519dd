// The MoE token dispatcher (quintet/parallel/expert/token_dispatcher.hpp): permutation, count
// exchange, the chunked row exchange around the experts, un-permutation and combine.
#include "quintet/parallel/expert/token_dispatcher.hpp"

#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/overlap/chunk_pipeline.hpp"

namespace quintet::expert {

namespace {

// [n, cols] on this tp rank -> [tp * n, cols], the ranks' blocks in order.
Tensor all_gather_rows(const Tensor& part, Communicator& tp, const Stream& s) {
  if (tp.size() == 1) return part;
  Shape shape = part.shape();
  shape[0] *= tp.size();
  Tensor out = Tensor::empty(shape, part.dtype(), part.device(), s);
  tp.all_gather(part.contiguous(s), out, s).wait(s);
  return out;
}

}  // namespace

TokenDispatcher::TokenDispatcher(Communicator& tp, Communicator* ep, Communicator* etp,
                                 const TokenDispatcherConfig& config)
    : tp_(&tp), ep_(ep), etp_(etp), config_(config) {}

bool TokenDispatcher::splits_tokens() const {
  return !config_.sequence_parallel && tp_->size() > 1;
}

bool TokenDispatcher::exchanges() const {
  return (ep_ != nullptr && ep_->size() > 1) || (etp_ != nullptr && etp_->size() > 1);
}

void TokenDispatcher::check_tokens(std::int64_t batch, std::int64_t seq) const {
  const int tpn = tp_->size();
  QUINTET_CHECK(!splits_tokens() || (batch * seq) % tpn == 0,
                "MoELayer: without sequence parallelism each of the tp = {} ranks dispatches 1/tp "
                "of the batch's tokens, and {} tokens (batch {} x seq {}) do not divide; use "
                "sequence parallelism or a batch whose tokens divide by tp",
                tpn, batch * seq, batch, seq);
}

Tensor TokenDispatcher::forward(const Tensor& x, const Routing& r, const ExpertsForward& experts,
                                DispatchHandle& h, const Stream& s) const {
  const std::int64_t E = config_.experts, T = x.size(0), d = x.size(1);
  const int tpn = tp_->size(), C = config_.chunks;
  const Device dev = x.device();
  h.tokens = T;
  h.first = splits_tokens() ? tp_->rank() * (T / tpn) : 0;
  h.count = splits_tokens() ? T / tpn : T;
  h.weights = r.weights.narrow(0, h.first, h.count);
  h.exchanged = exchanges();
  h.chunks.assign(static_cast<std::size_t>(C), DispatchHandle::Chunk{});
  const Tensor experts_own = r.experts.narrow(0, h.first, h.count);
  const Tensor kept_own = r.kept.narrow(0, h.first, h.count);
  const Tensor x_own = x.narrow(0, h.first, h.count);

  // Per chunk, its kept assignments permuted by expert (then token, then choice) and their rows
  // gathered in that order, in one pass.
  std::vector<Tensor> sorted, offsets;
  for (int c = 0; c < C; ++c) {
    DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
    ch.first = h.count * c / C;
    ch.count = h.count * (c + 1) / C - ch.first;
    nn::PermuteOutput p = nn::moe_permute(x_own.narrow(0, ch.first, ch.count),
                                          experts_own.narrow(0, ch.first, ch.count),
                                          kept_own.narrow(0, ch.first, ch.count), E, s);
    ch.counts = std::move(p.counts);
    ch.slot = std::move(p.slot);
    ch.source = std::move(p.source);
    sorted.push_back(std::move(p.rows));
    offsets.push_back(std::move(p.offsets));
  }
  Tensor out_own = Tensor::empty({h.count, d}, x.dtype(), dev, s);
  if (!h.exchanged) {
    // Nothing to exchange, so nothing waits for the counts: the experts read their rows' offsets
    // on the device and run on all the chunk's rows; the combine reads the kept ones.
    for (int c = 0; c < C; ++c) {
      DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
      ch.returned = experts(c, ExpertRows{sorted[c], {}, offsets[c]});
      nn::moe_unpermute_into(ch.returned, ch.slot, h.weights.narrow(0, ch.first, ch.count),
                             out_own.narrow(0, ch.first, ch.count), s);
    }
    return splits_tokens() ? all_gather_rows(out_own, *tp_, s) : out_own;
  }
  // One count exchange for all chunks: the host waits for it, once (the counts size the rows'
  // exchange).
  Tensor counts = Tensor::empty({C * E}, DType::i64, dev, s);
  for (int c = 0; c < C; ++c) {
    counts.narrow(0, c * E, E).copy_(h.chunks[static_cast<std::size_t>(c)].counts, s);
  }
  const std::vector<ExchangePlan> plans =
      plan_exchange(counts, C, config_.local_experts, ep_, etp_, s);
  for (int c = 0; c < C; ++c) {
    DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
    ch.plan = plans[static_cast<std::size_t>(c)];
    sorted[c] = sorted[c].narrow(0, 0, ch.plan.send_rows());  // the kept assignments' rows
  }

  // Chunk by chunk: chunk c + 1's rows travel while chunk c's experts run, and chunk c's
  // results travel back during chunk c + 1's.
  std::vector<PendingRows> coming(static_cast<std::size_t>(C)), back(coming.size());
  std::vector<Tensor> outputs(coming.size());
  // Lookahead 1: chunk c + 1's dispatch is issued before chunk c's experts.
  overlap::ChunkStages stages;
  stages.bring = [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    coming[i] = start_dispatch(sorted[i], h.chunks[i].plan, ep_, s);
    return coming[i].work;
  };
  stages.compute = [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    const ExchangePlan& plan = h.chunks[i].plan;
    const Tensor rows = finish_dispatch(coming[i], plan, etp_, s);
    ExpertRows in{rows, {}, Tensor()};
    for (std::int64_t le = 0; le < config_.local_experts; ++le) {
      in.counts.push_back(plan.expert_rows(le));
    }
    outputs[i] = experts(c, in);
  };
  stages.send = [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    back[i] = start_return(outputs[i], h.chunks[i].plan, ep_, etp_, s);
    return back[i].work;
  };
  // Back on the tokens' ranks: the weighted sum per token.
  stages.arrived = [&](int c, const Stream& on) {
    DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
    ch.returned = finish_return(back[static_cast<std::size_t>(c)], on);
    nn::moe_unpermute_into(ch.returned, ch.slot, h.weights.narrow(0, ch.first, ch.count),
                           out_own.narrow(0, ch.first, ch.count), on);
  };
  overlap::ChunkPipeline::run(C, stages, s).finish(s);
  return splits_tokens() ? all_gather_rows(out_own, *tp_, s) : out_own;
}

DispatchGrads TokenDispatcher::backward(const Tensor& dy, const DispatchHandle& h,
                                        const ExpertsBackward& experts,
                                        const ExpertGradientScope& scope, const Stream& s) const {
  const std::int64_t d = dy.size(1), k = h.weights.size(1);
  const int C = static_cast<int>(h.chunks.size());
  // The combine's backward per chunk: d(sorted outputs) and d(weights) of this rank's tokens.
  const Tensor dy_own = dy.narrow(0, h.first, h.count);
  Tensor dw_own = Tensor::empty({h.count, k}, DType::f32, dy.device(), s);
  std::vector<Tensor> drows;
  for (const DispatchHandle::Chunk& ch : h.chunks) {
    nn::UnpermuteGrads cg =
        nn::moe_unpermute_backward(dy_own.narrow(0, ch.first, ch.count), ch.returned, ch.slot,
                                   ch.source, h.weights.narrow(0, ch.first, ch.count), s);
    dw_own.narrow(0, ch.first, ch.count).copy_(cg.dweights, s);
    drows.push_back(std::move(cg.drows));
  }

  std::vector<Tensor> dinputs(static_cast<std::size_t>(C));
  Tensor dx_own = Tensor::empty({h.count, d}, dy.dtype(), dy.device(), s);
  const auto finish = [&] {
    DispatchGrads g;
    g.dx = splits_tokens() ? all_gather_rows(dx_own, *tp_, s) : dx_own;
    g.dweights = splits_tokens() ? all_gather_rows(dw_own, *tp_, s) : dw_own;
    return g;
  };
  if (!h.exchanged) {
    // The experts' backward on the rows they ran; each token sums its rows' gradients.
    scope([&](const Stream& st) {
      for (int c = 0; c < C; ++c) {
        const auto i = static_cast<std::size_t>(c);
        dinputs[i] = experts(c, drows[i], st);
      }
    });
    for (int c = 0; c < C; ++c) {
      const DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
      nn::moe_unpermute_into(dinputs[static_cast<std::size_t>(c)], ch.slot, Tensor(),
                             dx_own.narrow(0, ch.first, ch.count), s);
    }
    return finish();
  }
  // The experts' backward on the rows they ran, chunk by chunk as in forward: the gradients of
  // chunk c + 1 travel while chunk c's run.
  std::vector<PendingRows> coming(static_cast<std::size_t>(C)), back(coming.size());
  overlap::SentChunks returned;
  scope([&](const Stream& st) {
    overlap::ChunkStages stages;
    stages.bring = [&](int c) {
      const auto i = static_cast<std::size_t>(c);
      coming[i] = start_dispatch(drows[i], h.chunks[i].plan, ep_, st);
      return coming[i].work;
    };
    stages.compute = [&](int c) {
      const auto i = static_cast<std::size_t>(c);
      dinputs[i] = experts(c, finish_dispatch(coming[i], h.chunks[i].plan, etp_, st), st);
    };
    stages.send = [&](int c) {
      const auto i = static_cast<std::size_t>(c);
      back[i] = start_return(dinputs[i], h.chunks[i].plan, ep_, etp_, st);
      return back[i].work;
    };
    // Un-permute: each token sums the gradients of its sorted rows.
    stages.arrived = [&](int c, const Stream& on) {
      const DispatchHandle::Chunk& ch = h.chunks[static_cast<std::size_t>(c)];
      nn::moe_unpermute_into(finish_return(back[static_cast<std::size_t>(c)], on), ch.slot,
                             Tensor(), dx_own.narrow(0, ch.first, ch.count), on);
    };
    returned = overlap::ChunkPipeline::run(C, stages, st);
  });
  returned.finish(s);
  return finish();
}

}  // namespace quintet::expert
