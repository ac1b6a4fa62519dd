// The MoE layer: router, permutation, exchange (dispatch.cpp), experts, combine (moe_layer.hpp).
#include "quintet/parallel/expert/moe_layer.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "quintet/core/log.hpp"
#include "quintet/nn/ops.hpp"
#include "quintet/parallel/expert/dispatch.hpp"
#include "quintet/parallel/expert/permute.hpp"
#include "quintet/parallel/overlap/chunk_pipeline.hpp"

namespace quintet::expert {

namespace {

int size_of(Communicator* c) { return c != nullptr ? c->size() : 1; }
int rank_of(Communicator* c) { return c != nullptr ? c->rank() : 0; }

// The tokens [first, first + count) of the layer's B*S' that this rank dispatches.
struct OwnTokens {
  std::int64_t first = 0, count = 0;
};

// Chunk c of `chunks` near-equal consecutive parts of n tokens (possibly empty).
struct Range {
  std::int64_t first = 0, count = 0;
};
Range chunk_range(std::int64_t n, int chunks, int c) {
  const std::int64_t lo = n * c / chunks, hi = n * (c + 1) / chunks;
  return {lo, hi - lo};
}

void all_reduce_sum(const Tensor& t, Communicator* c, const Stream& s) {
  if (size_of(c) > 1) c->all_reduce(t, t, ReduceOp::sum, s).wait(s);
}

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

double MoEStats::min_load() const {
  return load.empty() ? 0.0 : *std::min_element(load.begin(), load.end());
}
double MoEStats::max_load() const {
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}
double MoEStats::mean_load() const {
  return load.empty()
             ? 0.0
             : std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
}

MoEStats combine(const std::vector<MoEStats>& layers) {
  MoEStats out;
  for (const MoEStats& s : layers) {
    out.load.insert(out.load.end(), s.load.begin(), s.load.end());
    out.assignments += s.assignments;
    out.dropped += s.dropped;
    out.aux_loss += s.aux_loss;
    out.z_loss += s.z_loss;
  }
  return out;
}

MoESummary summarize(const std::vector<MoEStats>& layers, Communicator& pp, const Stream& stream) {
  const MoEStats all = combine(layers);
  // Sums, then the minimum and the maximum, over the stages.
  std::vector<double> sums = {static_cast<double>(layers.size()),
                              std::accumulate(all.load.begin(), all.load.end(), 0.0),
                              static_cast<double>(all.load.size()),
                              all.assignments,
                              all.dropped,
                              all.aux_loss,
                              all.z_loss};
  std::vector<double> lo = {all.load.empty() ? std::numeric_limits<double>::infinity()
                                             : all.min_load()};
  std::vector<double> hi = {all.load.empty() ? 0.0 : all.max_load()};
  if (pp.size() > 1) {
    for (auto [v, op] : {std::pair{&sums, ReduceOp::sum}, std::pair{&lo, ReduceOp::min},
                         std::pair{&hi, ReduceOp::max}}) {
      Tensor t = Tensor::from_vector(*v, {static_cast<std::int64_t>(v->size())})
                     .to(stream.device(), stream);
      pp.all_reduce(t, t, op, stream).wait(stream);
      *v = t.to_vector<double>();
    }
  }
  MoESummary out;
  out.layers = static_cast<int>(sums[0]);
  if (out.layers == 0) return out;
  out.mean_load = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
  out.min_load = lo[0];
  out.max_load = hi[0];
  out.dropped_fraction = sums[3] > 0 ? sums[4] / sums[3] : 0.0;
  out.aux_loss = sums[5];
  out.z_loss = sums[6];
  return out;
}

MoELayer::MoELayer(const MoEGroups& groups, std::int64_t dim, const MoEOptions& options)
    : groups_(groups), dim_(dim), options_(options) {
  QUINTET_CHECK(groups.tp != nullptr,
                "MoELayer: no tensor-parallel communicator (pass a one-rank one for none)");
  options.router.validate();
  QUINTET_CHECK(dim > 0, "MoELayer: dim = {} must be > 0", dim);
  QUINTET_CHECK(options.expert_ffn > 0, "MoELayer: expert_ffn = {} must be > 0",
                options.expert_ffn);
  QUINTET_CHECK(options.overlap_chunks >= 1 && options.overlap_chunks <= 64,
                "MoELayer: overlap_chunks = {} must be between 1 and 64", options.overlap_chunks);
  QUINTET_CHECK(options.shared_experts >= 0, "MoELayer: shared_experts = {} must be >= 0",
                options.shared_experts);
  const int ep = size_of(groups.ep), etp = size_of(groups.etp);
  const std::int64_t E = options.router.experts, F = options.expert_ffn;
  QUINTET_CHECK(E % ep == 0,
                "MoELayer: {} experts are not divisible by the expert-parallel size ep = {}; each "
                "ep rank holds experts / ep of them",
                E, ep);
  QUINTET_CHECK(F % etp == 0,
                "MoELayer: expert_ffn = {} is not divisible by the expert-tensor-parallel size "
                "etp = {}",
                F, etp);
  local_experts_ = E / ep;
  first_expert_ = rank_of(groups.ep) * local_experts_;
  const std::int64_t El = local_experts_, Fl = F / etp, f0 = rank_of(groups.etp) * Fl;
  nn::ParameterAttributes router_attrs;
  router_attrs.reduce_over_tp = options.sequence_parallel;
  router_ = &add_parameter("router.weight", {E, dim}, nn::ParameterInit::normal(options.init_std),
                           router_attrs);
  // Expert weights: the [E, F, d] / [E, d, F] draws, sliced by expert (ep) and width (etp).
  const auto expert_attrs = [&](int width_dim, Shape full, Shape start) {
    nn::ParameterAttributes a;
    a.is_expert = true;
    a.shard_axis = etp > 1 ? Axis::etp : Axis::ep;
    a.shard_dim = etp > 1 ? width_dim : 0;
    a.full_shape = std::move(full);
    a.shard_start = std::move(start);
    return a;
  };
  fc_ = &add_parameter("experts.fc.weight", {El, Fl, dim},
                       nn::ParameterInit::normal(options.init_std),
                       expert_attrs(1, {E, F, dim}, {first_expert_, f0, 0}));
  if (options.activation == nn::Activation::swiglu) {
    up_ = &add_parameter("experts.up.weight", {El, Fl, dim},
                         nn::ParameterInit::normal(options.init_std),
                         expert_attrs(1, {E, F, dim}, {first_expert_, f0, 0}));
  }
  proj_ = &add_parameter("experts.proj.weight", {El, dim, Fl},
                         nn::ParameterInit::normal(options.proj_init_std),
                         expert_attrs(2, {E, dim, F}, {first_expert_, 0, f0}));
  if (options.shared_experts > 0) {
    shared_ = &add_module("shared",
                          std::make_unique<ParallelMLP>(
                              *groups.tp, dim, options.shared_experts * F,
                              ParallelMLPOptions{.activation = options.activation,
                                                 .init_std = options.init_std,
                                                 .proj_init_std = options.proj_init_std,
                                                 .sequence_parallel = options.sequence_parallel}));
  }
  bias_ = Tensor::zeros({E}, DType::f32);
  load_.assign(static_cast<std::size_t>(E), 0.0);
  idle_steps_.assign(static_cast<std::size_t>(E), 0);
}

void MoELayer::set_balance_bias(const std::vector<float>& values) {
  QUINTET_CHECK(static_cast<std::int64_t>(values.size()) == options_.router.experts,
                "MoELayer::set_balance_bias: {} values for {} experts", values.size(),
                options_.router.experts);
  bias_ = Tensor::from_vector(values, {options_.router.experts});
  bias_device_ = Tensor();  // uploaded again by the next forward on a GPU
}

Tensor MoELayer::forward(nn::Context& ctx, const Tensor& x) {
  const Stream& s = ctx.stream();
  Communicator& tp = *groups_.tp;
  const bool sp = options_.sequence_parallel;
  const RouterConfig& rc = options_.router;
  const std::int64_t E = rc.experts, k = rc.top_k, d = dim_;
  QUINTET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == d,
                "MoELayer: expected x [batch, seq, {}], got {}", d,
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const std::int64_t B = x.size(0), T = B * x.size(1);
  const int tpn = tp.size();
  const bool split_tokens = !sp && tpn > 1;
  QUINTET_CHECK(!split_tokens || T % tpn == 0,
                "MoELayer: without sequence parallelism each of the tp = {} ranks dispatches 1/tp "
                "of the batch's tokens, and {} tokens (batch {} x seq {}) do not divide; use "
                "sequence parallelism or a batch whose tokens divide by tp",
                tpn, T, B, x.size(1));
  const OwnTokens own = split_tokens ? OwnTokens{tp.rank() * (T / tpn), T / tpn} : OwnTokens{0, T};
  const Device dev = x.device();
  if (!sums_.defined() || sums_.device() != dev) {
    sums_ = Tensor::empty({2}, DType::f64, dev, s);
    sums_.fill_(0.0, s);
  }

  const Tensor x2 = x.contiguous(s).view({T, d});
  // 1. Router, in f32.
  const Tensor xf = nn::cast(x2, DType::f32, s);
  const Tensor logits =
      nn::linear_forward(xf, nn::cast(router_->use(s), DType::f32, s), Tensor(), s);
  const Routing r = route(logits, rc.bias_rate > 0.0f ? device_bias(dev, s) : Tensor(), rc, s);
  // The aux loss's per-sequence statistics, summed over the ranks holding parts of a sequence
  // (an evaluation, with no backward and nothing counted, needs none).
  Tensor aux_counts;
  const std::int64_t seq_tokens = x.size(1) * (sp ? tpn : 1) * size_of(groups_.cp);
  if (rc.aux_loss_coeff > 0.0f && !ctx.forward_only()) {
    AuxStats st = aux_stats(r, B, s);
    if (sp) {
      all_reduce_sum(st.counts, &tp, s);
      all_reduce_sum(st.prob_sum, &tp, s);
    }
    all_reduce_sum(st.counts, groups_.cp, s);
    all_reduce_sum(st.prob_sum, groups_.cp, s);
    if (ctx.counts_statistics()) accumulate_aux_loss(st, seq_tokens, rc, sums_.narrow(0, 0, 1), s);
    aux_counts = st.counts;
  }
  if (rc.z_loss_coeff > 0.0f && ctx.counts_statistics()) {
    accumulate_z_loss(logits, rc, sums_.narrow(0, 1, 1), s);
  }

  // 2. Per chunk of this rank's tokens, its kept assignments permuted by expert (then token, then
  // choice); one count exchange for all chunks (the host waits for it).
  const int C = chunks();
  const Tensor experts_own = r.experts.narrow(0, own.first, own.count);
  const Tensor kept_own = r.kept.narrow(0, own.first, own.count);
  const Tensor weights_own = r.weights.narrow(0, own.first, own.count);
  const Tensor x_own = x2.narrow(0, own.first, own.count);
  std::vector<Permutation> perms;
  Tensor counts = Tensor::empty({C * E}, DType::i64, dev, s);
  for (int c = 0; c < C; ++c) {
    const Range rg = chunk_range(own.count, C, c);
    perms.push_back(permute(experts_own.narrow(0, rg.first, rg.count).contiguous(s),
                            kept_own.narrow(0, rg.first, rg.count).contiguous(s), E, s));
    counts.narrow(0, c * E, E).copy_(perms.back().counts, s);
  }
  const std::vector<ExchangePlan> plans =
      plan_exchange(counts, C, local_experts_, groups_.ep, groups_.etp, s);
  std::vector<Tensor> sorted;
  for (int c = 0; c < C; ++c) {
    const Range rg = chunk_range(own.count, C, c);
    sorted.push_back(
        rg.count == 0 ? Tensor::empty({0, d}, x.dtype(), dev, s)
                      : nn::embedding_forward(perms[c].rows_of.narrow(0, 0, plans[c].send_rows()),
                                              x_own.narrow(0, rg.first, rg.count), s));
  }

  // 3. Chunk by chunk: chunk c + 1's rows travel while chunk c's experts run (one GEMM chain per
  // local expert over its rows), and chunk c's results travel back during chunk c + 1's.
  const Tensor w1 = fc_->use(s), w2 = proj_->use(s);
  const Tensor wu = up_ != nullptr ? up_->use(s) : Tensor();
  std::vector<Tensor> saved{x2, logits, r.probs, r.experts, r.weights, r.kept, aux_counts};
  std::vector<PendingRows> coming(static_cast<std::size_t>(C)), back(coming.size());
  std::vector<Tensor> outputs(coming.size());
  Tensor out_own = Tensor::empty({own.count, d}, x.dtype(), dev, s);
  ChunkStages stages;  // lookahead 1: chunk c + 1's dispatch is issued before chunk c's experts
  stages.bring = [&](int c) {
    coming[static_cast<std::size_t>(c)] = start_dispatch(sorted[c], plans[c], groups_.ep, s);
    return coming[static_cast<std::size_t>(c)].work;
  };
  stages.compute = [&](int c) {
    const ExchangePlan& plan = plans[c];
    const Tensor xs = finish_dispatch(coming[static_cast<std::size_t>(c)], plan, groups_.etp, s);
    Tensor ye = Tensor::empty({plan.gathered_rows(), d}, x.dtype(), dev, s);
    saved.push_back(plan.encode());
    saved.push_back(perms[c].slot);
    saved.push_back(xs);
    std::int64_t off = 0;
    for (std::int64_t le = 0; le < local_experts_; ++le) {
      const std::int64_t n = plan.expert_rows(le);
      if (n == 0) {
        saved.push_back(Tensor());
        saved.push_back(Tensor());
        continue;
      }
      const Tensor xe = xs.narrow(0, off, n);
      const Tensor a = nn::linear_forward(xe, w1.select(le), Tensor(), s);
      Tensor h, u;
      if (up_ != nullptr) {
        u = nn::linear_forward(xe, wu.select(le), Tensor(), s);
        h = nn::swiglu_forward(a, u, s);
      } else {
        h = nn::gelu_forward(a, s);
      }
      ye.narrow(0, off, n).copy_(nn::linear_forward(h, w2.select(le), Tensor(), s), s);
      saved.push_back(a);
      saved.push_back(u);
      off += n;
    }
    outputs[static_cast<std::size_t>(c)] = std::move(ye);
  };
  // Chunk c's results travel back during chunk c + 1's experts.
  stages.send = [&](int c) {
    const auto i = static_cast<std::size_t>(c);
    back[i] = start_return(outputs[i], plans[c], groups_.ep, groups_.etp, s);
    return back[i].work;
  };
  // 4. Back on the tokens' ranks: the weighted sum per token.
  stages.arrived = [&](int c, const Stream& on) {
    const Range rg = chunk_range(own.count, C, c);
    const Tensor ys = finish_return(back[static_cast<std::size_t>(c)], on);
    saved.push_back(ys);
    out_own.narrow(0, rg.first, rg.count)
        .copy_(combine_rows(ys, perms[c].slot,
                            weights_own.narrow(0, rg.first, rg.count).contiguous(on), on),
               on);
  };
  ChunkPipeline::run(C, stages, s).finish(s);
  Tensor y = (split_tokens ? all_gather_rows(out_own, tp, s) : out_own).view(x.shape());
  ctx.save(*this, std::move(saved));
  if (shared_ != nullptr) y = nn::add(y, shared_->forward(ctx, x), s);

  if (ctx.counts_statistics()) {
    std::int64_t n_send = 0;
    for (const ExchangePlan& plan : plans) {
      for (std::int64_t e = 0; e < E; ++e) load_[e] += static_cast<double>(plan.send[e]);
      n_send += plan.send_rows();
    }
    assignments_ += static_cast<double>(own.count * k);
    dropped_ += static_cast<double>(own.count * k - n_send);
    microbatches_ += 1.0;
  }
  return y;
}

Tensor MoELayer::backward(nn::Context& ctx, const Tensor& dy) {
  const Stream& s = ctx.stream();
  Communicator& tp = *groups_.tp;
  const bool sp = options_.sequence_parallel;
  const RouterConfig& rc = options_.router;
  const std::int64_t k = rc.top_k, d = dim_;
  Tensor dx_shared;
  if (shared_ != nullptr) dx_shared = shared_->backward(ctx, dy);
  const std::vector<Tensor> saved = ctx.take(*this);
  const Tensor& x2 = saved[0];
  const Tensor& logits = saved[1];
  Routing r{saved[2], saved[3], saved[4], saved[5], 0};
  const Tensor& aux_counts = saved[6];
  const std::int64_t T = x2.size(0);
  const int tpn = tp.size();
  const bool split_tokens = !sp && tpn > 1;
  const OwnTokens own = split_tokens ? OwnTokens{tp.rank() * (T / tpn), T / tpn} : OwnTokens{0, T};
  const int C = chunks();
  // Saved per chunk c: its plan, slots, dispatched rows and per local expert (a, u), from
  // chunk_base(c); its returned rows at the end.
  const std::size_t per_chunk = 3 + 2 * static_cast<std::size_t>(local_experts_);
  const auto chunk_base = [&](int c) { return 7 + per_chunk * static_cast<std::size_t>(c); };
  const auto ys_of = [&](int c) -> const Tensor& {
    return saved[7 + per_chunk * static_cast<std::size_t>(C) + static_cast<std::size_t>(c)];
  };
  std::vector<ExchangePlan> plans;
  for (int c = 0; c < C; ++c) {
    plans.push_back(ExchangePlan::decode(saved[chunk_base(c)], size_of(groups_.ep),
                                         size_of(groups_.etp), rank_of(groups_.etp),
                                         local_experts_));
  }

  // Combine backward per chunk: d(sorted outputs) and d(weights) of this rank's tokens.
  const Tensor dy2 = dy.contiguous(s).view({T, d});
  const Tensor dy_own = dy2.narrow(0, own.first, own.count);
  const Tensor weights_own = r.weights.narrow(0, own.first, own.count);
  Tensor dw_own = Tensor::empty({own.count, k}, DType::f32, dy.device(), s);
  std::vector<Tensor> drows;
  for (int c = 0; c < C; ++c) {
    const Range rg = chunk_range(own.count, C, c);
    CombineGrads cg = combine_rows_backward(
        dy_own.narrow(0, rg.first, rg.count).contiguous(s), ys_of(c), saved[chunk_base(c) + 1],
        weights_own.narrow(0, rg.first, rg.count).contiguous(s), s);
    dw_own.narrow(0, rg.first, rg.count).copy_(cg.dweights, s);
    drows.push_back(std::move(cg.drows));
  }

  // The experts' backward on the rows they ran, chunk by chunk as in forward: the gradients of
  // chunk c + 1 travel while chunk c's run.
  const Tensor w1 = fc_->data(), w2 = proj_->data();
  const Tensor wu = up_ != nullptr ? up_->data() : Tensor();
  std::vector<PendingRows> coming(static_cast<std::size_t>(C)), back(coming.size());
  std::vector<Tensor> dinputs(coming.size());
  Tensor dx_own = Tensor::empty({own.count, d}, dy.dtype(), dy.device(), s);
  SentChunks returned;
  nn::accumulate_gradients(
      ctx, {fc_, up_, proj_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        ChunkStages stages;
        stages.bring = [&](int c) {
          coming[static_cast<std::size_t>(c)] = start_dispatch(drows[c], plans[c], groups_.ep, st);
          return coming[static_cast<std::size_t>(c)].work;
        };
        stages.compute = [&](int c) {
          const ExchangePlan& plan = plans[c];
          const Tensor dye =
              finish_dispatch(coming[static_cast<std::size_t>(c)], plan, groups_.etp, st);
          const Tensor& xs = saved[chunk_base(c) + 2];
          Tensor dxe = Tensor::empty({plan.gathered_rows(), d}, dy.dtype(), dy.device(), st);
          std::int64_t off = 0;
          for (std::int64_t le = 0; le < local_experts_; ++le) {
            const std::int64_t n = plan.expert_rows(le);
            if (n == 0) continue;
            const Tensor xe = xs.narrow(0, off, n), dyo = dye.narrow(0, off, n);
            const Tensor& a = saved[chunk_base(c) + 3 + 2 * static_cast<std::size_t>(le)];
            const Tensor& u = saved[chunk_base(c) + 4 + 2 * static_cast<std::size_t>(le)];
            const Tensor h =
                up_ != nullptr ? nn::swiglu_forward(a, u, st) : nn::gelu_forward(a, st);
            nn::linear_backward_weight(dyo, h, g[2].select(le), Tensor(), st);
            const Tensor dh = nn::linear_backward_input(dyo, w2.select(le), st);
            Tensor dxo;
            if (up_ != nullptr) {
              const nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, u, st);
              nn::linear_backward_weight(sg.dgate, xe, g[0].select(le), Tensor(), st);
              nn::linear_backward_weight(sg.dup, xe, g[1].select(le), Tensor(), st);
              dxo = nn::linear_backward_input(sg.dgate, w1.select(le), st);
              nn::add_(dxo, nn::linear_backward_input(sg.dup, wu.select(le), st), 1.0f, st);
            } else {
              const Tensor da = nn::gelu_backward(dh, a, st);
              nn::linear_backward_weight(da, xe, g[0].select(le), Tensor(), st);
              dxo = nn::linear_backward_input(da, w1.select(le), st);
            }
            dxe.narrow(0, off, n).copy_(dxo, st);
            off += n;
          }
          dinputs[static_cast<std::size_t>(c)] = std::move(dxe);
        };
        stages.send = [&](int c) {
          const auto i = static_cast<std::size_t>(c);
          back[i] = start_return(dinputs[i], plans[c], groups_.ep, groups_.etp, st);
          return back[i].work;
        };
        // Unpermute: each token sums the gradients of its sorted rows.
        stages.arrived = [&](int c, const Stream& on) {
          const Range rg = chunk_range(own.count, C, c);
          dx_own.narrow(0, rg.first, rg.count)
              .copy_(combine_rows(finish_return(back[static_cast<std::size_t>(c)], on),
                                  saved[chunk_base(c) + 1], Tensor(), on),
                     on);
        };
        returned = ChunkPipeline::run(C, stages, st);
      },
      nn::GradTiming::now);
  returned.finish(s);
  Tensor dx = split_tokens ? all_gather_rows(dx_own, tp, s) : dx_own;

  // Router: d(weights) of every token this rank routed, then the load-balancing terms.
  const Tensor dweights = split_tokens ? all_gather_rows(dw_own, tp, s) : dw_own;
  Tensor dprobs = weights_backward(r, dweights, rc, s);
  if (rc.aux_loss_coeff > 0.0f) {
    const std::int64_t B = aux_counts.size(0);
    const std::int64_t seq = (T / B) * (sp ? tpn : 1) * size_of(groups_.cp);
    // The aux loss spans each whole sequence; data parallelism averages the router's gradient
    // over cp, so each cp rank's part counts cp times.
    const AuxStats st{aux_counts, Tensor()};
    add_aux_loss_grad(st, seq, rc, ctx.loss_scale() * static_cast<float>(size_of(groups_.cp)),
                      dprobs, s);
  }
  Tensor dlogits = scores_backward(r.probs, dprobs, rc.score, s);
  if (rc.z_loss_coeff > 0.0f) {
    const double tokens = static_cast<double>(T) * (sp ? tpn : 1);
    add_z_loss_grad(logits, rc, static_cast<float>(ctx.loss_scale() / tokens), dlogits, s);
  }
  // The router's gradient in its gradient's dtype: f32 (bf16 and f32 layers), f64 (f64 layers).
  const DType gdt = nn::accum_dtype(x2.dtype());
  const Tensor xg = nn::cast(x2, gdt, s), dlogits_g = nn::cast(dlogits, gdt, s);
  nn::accumulate_gradients(
      ctx, {router_},
      [&](const std::vector<Tensor>& g, const Stream& st) {
        nn::linear_backward_weight(dlogits_g, xg, g[0], Tensor(), st);
      },
      nn::GradTiming::now);
  const Tensor dx_router =
      nn::linear_backward_input(dlogits, nn::cast(router_->data(), DType::f32, s), s);
  nn::add_(dx, nn::cast(dx_router, dx.dtype(), s), 1.0f, s);
  Tensor out = dx.view(dy.shape());
  if (dx_shared.defined()) nn::add_(out, dx_shared, 1.0f, s);
  return out;
}

const Tensor& MoELayer::device_bias(const Device& device, const Stream& stream) {
  if (device.is_cpu()) return bias_;
  if (!bias_device_.defined() || bias_device_.device() != device) {
    bias_device_ = bias_.to(device, stream);
  }
  return bias_device_;
}

Tensor MoELayer::take_counters(std::vector<double>& host) {
  host.insert(host.end(), load_.begin(), load_.end());
  host.insert(host.end(), {assignments_, dropped_, 0.0, 0.0, microbatches_});
  std::fill(load_.begin(), load_.end(), 0.0);
  assignments_ = dropped_ = microbatches_ = 0.0;
  return std::exchange(sums_, Tensor());  // the next forward starts a zeroed one
}

MoEStats MoELayer::finish_step(const double* summed, const Communicator& stage,
                               const Stream& stream) {
  const std::int64_t E = options_.router.experts;
  MoEStats out;
  out.load.assign(summed, summed + E);
  out.assignments = summed[E];
  out.dropped = summed[E + 1];
  const double mbs = summed[E + 4];
  out.aux_loss = mbs > 0 ? summed[E + 2] / mbs : 0.0;
  out.z_loss = mbs > 0 ? summed[E + 3] / mbs : 0.0;
  if (options_.router.bias_rate > 0.0f) {
    update_balance_bias(bias_, out.load, options_.router.bias_rate);
    // The next step's routing reads the new bias; uploading it here keeps forward free of copies.
    if (bias_device_.defined()) bias_device_ = bias_.to(bias_device_.device(), stream);
  }
  check_idle_experts(out, stage);
  return out;
}

MoEStats MoELayer::finish_step(Communicator& stage, const Stream& stream) {
  const std::vector<MoELayer*> one = {this};
  const StepCounters reduced = reduce_step_counters(one, stage, stream);
  const Tensor counters = reduced.summed.to(Device::cpu(), stream);
  stream.synchronize();
  return finish_steps(one, counters, stage, stream).front();
}

StepCounters reduce_step_counters(const std::vector<MoELayer*>& layers, Communicator& stage,
                                  const Stream& stream) {
  std::vector<double> host;
  std::vector<std::pair<std::int64_t, Tensor>> sums;  // (offset of the aux sum, the [2] sums)
  for (MoELayer* layer : layers) {
    const std::int64_t at = static_cast<std::int64_t>(host.size());
    Tensor s = layer->take_counters(host);
    if (s.defined()) sums.emplace_back(at + layer->options().router.experts + 2, std::move(s));
  }
  // From pinned memory, so that the upload does not wait for the stream (a pageable one would).
  StepCounters out;
  if (host.empty()) return out;
  out.staging = Tensor::empty_pinned({static_cast<std::int64_t>(host.size())}, DType::f64);
  std::copy(host.begin(), host.end(), out.staging.data<double>());
  out.summed = out.staging.to(stream.device(), stream);
  for (auto& [at, s] : sums) {
    out.summed.narrow(0, at, 2).copy_(s.to(stream.device(), stream), stream);
  }
  if (stage.size() > 1) {
    stage.all_reduce(out.summed, out.summed, ReduceOp::sum, stream).wait(stream);
  }
  return out;
}

std::vector<MoEStats> finish_steps(const std::vector<MoELayer*>& layers, const Tensor& counters,
                                   const Communicator& stage, const Stream& stream) {
  std::int64_t total = 0;
  for (const MoELayer* layer : layers) total += layer->counters_size();
  QUINTET_CHECK(
      counters.device().is_cpu() && counters.dtype() == DType::f64 && counters.numel() == total,
      "finish_steps: the counters are {} {} values on {}; want the {} f64 values of "
      "reduce_step_counters for these {} layers, on the CPU",
      counters.numel(), dtype_name(counters.dtype()), counters.device().str(), total,
      layers.size());
  const double* at = counters.data<double>();
  std::vector<MoEStats> out;
  for (MoELayer* layer : layers) {
    out.push_back(layer->finish_step(at, stage, stream));
    at += layer->counters_size();
  }
  return out;
}

void MoELayer::check_idle_experts(const MoEStats& step, const Communicator& stage) {
  const RouterConfig& rc = options_.router;
  std::vector<std::int64_t> idle;
  for (std::size_t e = 0; e < idle_steps_.size(); ++e) {
    idle_steps_[e] = step.load[e] == 0.0 ? idle_steps_[e] + 1 : 0;
    if (rc.idle_warning_steps > 0 && idle_steps_[e] >= rc.idle_warning_steps) {
      idle.push_back(static_cast<std::int64_t>(e));
    }
  }
  if (idle.empty() || warned_idle_) return;
  warned_idle_ = true;  // on every rank of the stage: they all hold the same load
  if (stage.rank() != 0) return;
  // The layer's name from its router's (the store names it, e.g. "block0.mlp.router.weight").
  std::string name = router_->name();
  const std::string suffix = "router.weight";
  name = name.size() > suffix.size() ? name.substr(0, name.size() - suffix.size() - 1) : "";
  log::warn(
      "MoE layer{}{}: expert{} {} received no token in the last {} steps (this step's tokens "
      "per expert: min {}, mean {}, max {}): routing has collapsed onto the other experts, which "
      "then learn alone. Turn on or raise load balancing: RouterConfig aux_loss_coeff (now {}, "
      "--aux-loss-coeff) or bias_rate (now {}, --aux-free-bias-rate). Said once per layer; "
      "RouterConfig::idle_warning_steps sets after how many steps (0: never).",
      name.empty() ? "" : " ", name, idle.size() > 1 ? "s" : "", fmt::join(idle, ", "),
      rc.idle_warning_steps, step.min_load(), step.mean_load(), step.max_load(), rc.aux_loss_coeff,
      rc.bias_rate);
}

}  // namespace quintet::expert
