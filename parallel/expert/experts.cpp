// The MoE layer's expert MLPs (quintet/parallel/expert/experts.hpp): one GEMM chain per local
// expert over its block of rows.
#include "quintet/parallel/expert/experts.hpp"

#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::expert {

Experts::Experts(const AddParameter& add, const ExpertsConfig& c)
    : local_experts_(c.experts / c.ep), first_expert_(c.ep_rank * (c.experts / c.ep)) {
  const std::int64_t El = local_experts_, E = c.experts, F = c.ffn, d = c.dim;
  const std::int64_t Fl = F / c.etp, f0 = c.etp_rank * Fl;
  // The [E, F, d] / [E, d, F] draws, sliced by expert (ep) and width (etp).
  const auto attrs = [&](int width_dim, Shape full, Shape start) {
    nn::ParameterAttributes a;
    a.is_expert = true;
    a.shard_axis = c.etp > 1 ? Axis::etp : Axis::ep;
    a.shard_dim = c.etp > 1 ? width_dim : 0;
    a.full_shape = std::move(full);
    a.shard_start = std::move(start);
    return a;
  };
  fc_ = &add("experts.fc.weight", {El, Fl, d}, nn::ParameterInit::normal(c.init_std),
             attrs(1, {E, F, d}, {first_expert_, f0, 0}));
  if (c.activation == nn::Activation::swiglu) {
    up_ = &add("experts.up.weight", {El, Fl, d}, nn::ParameterInit::normal(c.init_std),
               attrs(1, {E, F, d}, {first_expert_, f0, 0}));
  }
  proj_ = &add("experts.proj.weight", {El, d, Fl}, nn::ParameterInit::normal(c.proj_init_std),
               attrs(2, {E, d, F}, {first_expert_, 0, f0}));
}

ExpertWeights Experts::use(const Stream& stream) const {
  return {fc_->use(stream), up_ != nullptr ? up_->use(stream) : Tensor(), proj_->use(stream)};
}

ExpertWeights Experts::data() const {
  return {fc_->data(), up_ != nullptr ? up_->data() : Tensor(), proj_->data()};
}

Tensor Experts::forward(const ExpertWeights& w, const Tensor& rows,
                        std::vector<std::int64_t> counts, ExpertsActivations& saved,
                        const Stream& s) const {
  QUINTET_CHECK(static_cast<std::int64_t>(counts.size()) == local_experts_,
                "Experts::forward: {} row counts for {} local experts", counts.size(),
                local_experts_);
  const std::int64_t d = rows.size(1);
  Tensor y = Tensor::empty({rows.size(0), d}, rows.dtype(), rows.device(), s);
  saved.rows = rows;
  saved.fc_out.assign(counts.size(), Tensor());
  saved.up_out.assign(counts.size(), Tensor());
  std::int64_t off = 0;
  for (std::int64_t le = 0; le < local_experts_; ++le) {
    const std::int64_t n = counts[static_cast<std::size_t>(le)];
    if (n == 0) continue;
    const Tensor xe = rows.narrow(0, off, n);
    Tensor a = nn::linear_forward(xe, w.fc.select(le), Tensor(), s);
    Tensor h, u;
    if (up_ != nullptr) {
      u = nn::linear_forward(xe, w.up.select(le), Tensor(), s);
      h = nn::swiglu_forward(a, u, s);
    } else {
      h = nn::gelu_forward(a, s);
    }
    y.narrow(0, off, n).copy_(nn::linear_forward(h, w.proj.select(le), Tensor(), s), s);
    saved.fc_out[static_cast<std::size_t>(le)] = std::move(a);
    saved.up_out[static_cast<std::size_t>(le)] = std::move(u);
    off += n;
  }
  QUINTET_CHECK(off == rows.size(0), "Experts::forward: counts summing to {} for {} rows", off,
                rows.size(0));
  saved.counts = std::move(counts);
  return y;
}

Tensor Experts::backward(const ExpertWeights& w, const Tensor& dy, const ExpertsActivations& saved,
                         const std::vector<Tensor>& grads, const Stream& s) const {
  const Tensor& xs = saved.rows;
  const std::int64_t d = xs.size(1);
  Tensor dx = Tensor::empty({xs.size(0), d}, dy.dtype(), dy.device(), s);
  std::int64_t off = 0;
  for (std::int64_t le = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = saved.counts[i];
    if (n == 0) continue;
    const Tensor xe = xs.narrow(0, off, n), dyo = dy.narrow(0, off, n);
    const Tensor& a = saved.fc_out[i];
    const Tensor& u = saved.up_out[i];
    const Tensor h = up_ != nullptr ? nn::swiglu_forward(a, u, s) : nn::gelu_forward(a, s);
    nn::linear_backward_weight(dyo, h, grads[2].select(le), Tensor(), s);
    const Tensor dh = nn::linear_backward_input(dyo, w.proj.select(le), s);
    Tensor dxo;
    if (up_ != nullptr) {
      const nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, u, s);
      nn::linear_backward_weight(sg.dgate, xe, grads[0].select(le), Tensor(), s);
      nn::linear_backward_weight(sg.dup, xe, grads[1].select(le), Tensor(), s);
      dxo = nn::linear_backward_input(sg.dgate, w.fc.select(le), s);
      nn::add_(dxo, nn::linear_backward_input(sg.dup, w.up.select(le), s), 1.0f, s);
    } else {
      const Tensor da = nn::gelu_backward(dh, a, s);
      nn::linear_backward_weight(da, xe, grads[0].select(le), Tensor(), s);
      dxo = nn::linear_backward_input(da, w.fc.select(le), s);
    }
    dx.narrow(0, off, n).copy_(dxo, s);
    off += n;
  }
  return dx;
}

}  // namespace quintet::expert
