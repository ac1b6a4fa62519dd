// The MoE layer's expert MLPs (quintet/parallel/expert/experts.hpp): one GEMM chain per local
// expert over its block of rows.
#include "quintet/parallel/expert/experts.hpp"

#include <numeric>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::expert {

namespace {
// The per-expert blocks (counts[i] rows each, undefined when 0) as one [sum, width] tensor of
// like's dtype and device, and back as views: FP8 scales one tensor over every expert.
Tensor join(const std::vector<Tensor>& parts, const std::vector<std::int64_t>& counts,
            std::int64_t width, const Tensor& like, const Stream& s) {
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  Tensor whole = Tensor::empty({total, width}, like.dtype(), like.device(), s);
  std::int64_t off = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (counts[i] > 0) whole.narrow(0, off, counts[i]).copy_(parts[i], s);
    off += counts[i];
  }
  return whole;
}
std::vector<Tensor> split(const Tensor& whole, const std::vector<std::int64_t>& counts) {
  std::vector<Tensor> parts(counts.size());
  std::int64_t off = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) parts[i] = whole.narrow(0, off, counts[i]);
    off += counts[i];
  }
  return parts;
}
}  // namespace

Experts::Experts(const AddParameter& add, const ExpertsConfig& c, ExpertsFp8 fp8)
    : local_experts_(c.experts / c.ep),
      first_expert_(c.ep_rank * (c.experts / c.ep)),
      fp8_(std::move(fp8)) {
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
                        std::vector<std::int64_t> counts, ExpertsActivations& saved, bool record,
                        const Stream& s) {
  QUINTET_CHECK(static_cast<std::int64_t>(counts.size()) == local_experts_,
                "Experts::forward: {} row counts for {} local experts", counts.size(),
                local_experts_);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  QUINTET_CHECK(total == rows.size(0), "Experts::forward: counts summing to {} for {} rows", total,
                rows.size(0));
  const bool fp8 = fp8_.fc.on();
  // With FP8, the rows and the weights as the FP8 GEMMs see them (up shares fc's x scale, so its
  // rows are fc's).
  const Fp8Linear::Inputs fc =
      fp8 ? fp8_.fc.forward(rows, w.fc, *fp8_.stage, record, s) : Fp8Linear::Inputs{rows, w.fc};
  const Tensor up_w =
      fp8 && up_ != nullptr ? fp8_.up.forward(rows, w.up, *fp8_.stage, record, s).w : w.up;
  saved.rows = fc.x;
  saved.fc_out.assign(counts.size(), Tensor());
  saved.up_out.assign(counts.size(), Tensor());
  std::vector<Tensor> h(counts.size());
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    const Tensor xe = fc.x.narrow(0, off, n);
    Tensor a = nn::linear_forward(xe, fc.w.select(le), Tensor(), s);
    Tensor u;
    if (up_ != nullptr) {
      u = nn::linear_forward(xe, up_w.select(le), Tensor(), s);
      h[i] = nn::swiglu_forward(a, u, s);
    } else {
      h[i] = nn::gelu_forward(a, s);
    }
    saved.fc_out[i] = std::move(a);
    saved.up_out[i] = std::move(u);
    off += n;
  }
  Tensor proj_w = w.proj;
  if (fp8) {  // proj's input over every expert's rows, through FP8 at one scale
    const Fp8Linear::Inputs p =
        fp8_.proj.forward(join(h, counts, w.proj.size(2), rows, s), w.proj, *fp8_.stage, record, s);
    h = split(p.x, counts);
    proj_w = p.w;
    saved.proj_in = h;
  }
  Tensor y = Tensor::empty({rows.size(0), rows.size(1)}, rows.dtype(), rows.device(), s);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    y.narrow(0, off, n).copy_(nn::linear_forward(h[i], proj_w.select(le), Tensor(), s), s);
    off += n;
  }
  saved.counts = std::move(counts);
  return y;
}

Tensor Experts::backward(const ExpertWeights& w, const Tensor& dy_in,
                         const ExpertsActivations& saved, const std::vector<Tensor>& grads,
                         const Stream& s) {
  const Tensor& xs = saved.rows;  // q(x) with FP8
  const bool fp8 = fp8_.fc.on();
  // With FP8, dy and proj's weight as the FP8 GEMMs see them.
  const Tensor dy = fp8 ? fp8_.proj.output_grad(dy_in, *fp8_.stage, s) : dy_in;
  const Tensor proj_w = fp8 ? fp8_.proj.weight(w.proj, s) : w.proj;
  const std::size_t El = saved.counts.size();
  // proj's gradients, and the gradients of fc's (and up's) outputs.
  std::vector<Tensor> da(El), du(El);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = saved.counts[i];
    if (n == 0) continue;
    const Tensor dyo = dy.narrow(0, off, n);
    const Tensor& a = saved.fc_out[i];
    const Tensor& u = saved.up_out[i];
    const Tensor h = fp8              ? saved.proj_in[i]
                     : up_ != nullptr ? nn::swiglu_forward(a, u, s)
                                      : nn::gelu_forward(a, s);
    nn::linear_backward_weight(dyo, h, grads[2].select(le), Tensor(), s);
    const Tensor dh = nn::linear_backward_input(dyo, proj_w.select(le), s);
    if (up_ != nullptr) {
      nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, u, s);
      da[i] = std::move(sg.dgate);
      du[i] = std::move(sg.dup);
    } else {
      da[i] = nn::gelu_backward(dh, a, s);
    }
    off += n;
  }
  Tensor fc_w = w.fc, up_w = w.up;
  if (fp8) {  // the gradients of fc's and up's outputs over every expert's rows, through FP8
    const std::int64_t width = w.fc.size(1);
    da = split(fp8_.fc.output_grad(join(da, saved.counts, width, xs, s), *fp8_.stage, s),
               saved.counts);
    fc_w = fp8_.fc.weight(w.fc, s);
    if (up_ != nullptr) {
      du = split(fp8_.up.output_grad(join(du, saved.counts, width, xs, s), *fp8_.stage, s),
                 saved.counts);
      up_w = fp8_.up.weight(w.up, s);
    }
  }
  Tensor dx = Tensor::empty({xs.size(0), xs.size(1)}, dy.dtype(), dy.device(), s);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = saved.counts[i];
    if (n == 0) continue;
    const Tensor xe = xs.narrow(0, off, n);
    nn::linear_backward_weight(da[i], xe, grads[0].select(le), Tensor(), s);
    Tensor dxo = nn::linear_backward_input(da[i], fc_w.select(le), s);
    if (up_ != nullptr) {
      nn::linear_backward_weight(du[i], xe, grads[1].select(le), Tensor(), s);
      nn::add_(dxo, nn::linear_backward_input(du[i], up_w.select(le), s), 1.0f, s);
    }
    dx.narrow(0, off, n).copy_(dxo, s);
    off += n;
  }
  return dx;
}

}  // namespace quintet::expert
