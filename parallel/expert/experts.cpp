// The MoE layer's expert MLPs (quintet/parallel/expert/experts.hpp): each projection one grouped
// linear op over every local expert's block of rows (the FP8 path: one GEMM chain per expert).
#include "quintet/parallel/expert/experts.hpp"

#include <algorithm>
#include <numeric>
#include <span>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/nn/grouped_linear.hpp"
#include "quintet/nn/ops.hpp"

namespace quintet::expert {

namespace {
// The row count of each group of offsets.
std::vector<std::int64_t> counts_of(const std::vector<std::int64_t>& offsets) {
  std::vector<std::int64_t> counts;
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i)
    counts.push_back(offsets[i + 1] - offsets[i]);
  return counts;
}

// The per-expert blocks (counts[i] rows each, undefined when 0) as one [sum, width] tensor of
// like's dtype and device: FP8 scales one tensor over every expert.
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

// x [rows, cols] in FP8 at scale.scale (recording its amax into scale.amax when defined), with
// its transpose for backward's GEMMs.
nn::Fp8Tensor cast(const Tensor& x, const tensor_parallel::Fp8Linear::Scale& scale,
                   nn::Fp8Format format, const Stream& s) {
  return nn::fp8_cast(x.contiguous(s), scale.scale, format, true, scale.amax, s);
}
// The transpose of q as an FP8 GEMM operand.
nn::Fp8Tensor transposed(const nn::Fp8Tensor& q) {
  return nn::Fp8Tensor{q.transposed, Tensor(), q.scale, q.format};
}
// y [rows, m] = q(a) · q(b)ᵀ in like's dtype; the forward's with fast accumulation into bf16, as
// the tp layers' (parallel/tensor_parallel/linear.cpp).
// gemm_into writes it into y (contiguous, e.g. a block of rows of a larger tensor).
void gemm_into(const nn::Fp8Tensor& a, const nn::Fp8Tensor& b, const Tensor& y, bool forward,
               const Stream& s) {
  nn::fp8_gemm(a, b, Tensor(), y, false, forward && y.dtype() == DType::bf16, s);
}
Tensor gemm(const nn::Fp8Tensor& a, const nn::Fp8Tensor& b, const Tensor& like, bool forward,
            const Stream& s) {
  Tensor y = Tensor::empty({a.data.size(0), b.data.size(0)}, like.dtype(), like.device(), s);
  gemm_into(a, b, y, forward, s);
  return y;
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
  saved = ExpertsActivations{};
  saved.host_offsets = nn::group_offsets(counts);
  const auto size = static_cast<std::int64_t>(saved.host_offsets.size());
  if (rows.device().is_cpu()) {
    saved.offsets = Tensor::from_vector(saved.host_offsets, {size});
  } else {
    // From pinned memory, kept with the activations, so that the upload does not wait for the
    // stream (a pageable one would).
    saved.offsets_staging = Tensor::empty_pinned({size}, DType::i64);
    std::copy(saved.host_offsets.begin(), saved.host_offsets.end(),
              saved.offsets_staging.data<std::int64_t>());
    saved.offsets = saved.offsets_staging.to(rows.device(), s);
  }
  if (fp8_.fc.on()) return forward_fp8(w, rows, saved, record, s);
  return forward_grouped(w, rows, saved, s);
}

Tensor Experts::forward(const ExpertWeights& w, const Tensor& rows, const Tensor& offsets,
                        ExpertsActivations& saved, bool /*record*/, const Stream& s) {
  QUINTET_CHECK(!fp8_.fc.on(),
                "Experts::forward: the FP8 experts need the row counts on the host; call the form "
                "taking counts");
  QUINTET_CHECK(offsets.defined() && offsets.dim() == 1 && offsets.size(0) == local_experts_ + 1,
                "Experts::forward: offsets are {}; expected [{}] (local experts + 1)",
                offsets.defined() ? shape_str(offsets.shape()) : std::string("undefined"),
                local_experts_ + 1);
  saved = ExpertsActivations{};
  saved.offsets = offsets;
  return forward_grouped(w, rows, saved, s);
}

Tensor Experts::forward_grouped(const ExpertWeights& w, const Tensor& rows,
                                ExpertsActivations& saved, const Stream& s) {
  const Tensor& o = saved.offsets;
  const std::span<const std::int64_t> ho = saved.host_offsets;
  saved.rows = rows;
  saved.fc_out = nn::grouped_linear_forward(rows, w.fc, o, ho, s);
  Tensor h;
  if (up_ != nullptr) {
    saved.up_out = nn::grouped_linear_forward(rows, w.up, o, ho, s);
    h = nn::swiglu_forward(saved.fc_out, saved.up_out, s);
  } else {
    h = nn::gelu_forward(saved.fc_out, s);
  }
  return nn::grouped_linear_forward(h, w.proj, o, ho, s);
}

Tensor Experts::backward(const ExpertWeights& w, const Tensor& dy, const ExpertsActivations& saved,
                         const std::vector<Tensor>& grads, const Stream& s) {
  if (fp8_.fc.on()) return backward_fp8(dy, saved, grads, s);
  const Tensor& o = saved.offsets;
  const std::span<const std::int64_t> ho = saved.host_offsets;
  const Tensor& xs = saved.rows;
  const Tensor& a = saved.fc_out;
  const Tensor& u = saved.up_out;
  const Tensor h = up_ != nullptr ? nn::swiglu_forward(a, u, s) : nn::gelu_forward(a, s);
  nn::grouped_linear_backward_weight(dy, h, o, grads[2], ho, s);
  const Tensor dh = nn::grouped_linear_backward_input(dy, w.proj, o, ho, s);
  if (up_ != nullptr) {
    const nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, u, s);
    nn::grouped_linear_backward_weight(sg.dgate, xs, o, grads[0], ho, s);
    nn::grouped_linear_backward_weight(sg.dup, xs, o, grads[1], ho, s);
    Tensor dx = nn::grouped_linear_backward_input(sg.dgate, w.fc, o, ho, s);
    nn::add_(dx, nn::grouped_linear_backward_input(sg.dup, w.up, o, ho, s), 1.0f, s);
    return dx;
  }
  const Tensor da = nn::gelu_backward(dh, a, s);
  nn::grouped_linear_backward_weight(da, xs, o, grads[0], ho, s);
  return nn::grouped_linear_backward_input(da, w.fc, o, ho, s);
}

// ---- FP8: nn::fp8_cast and nn::fp8_gemm, the tp layers' FP8 GEMM (cuBLASLt's on a GPU, the
// exact emulation on the CPU), at the per-tensor scales of Fp8Linear's device-scale calls ----

Tensor Experts::forward_fp8(const ExpertWeights& w, const Tensor& rows, ExpertsActivations& saved,
                            bool record, const Stream& s) {
  Communicator& stage = *fp8_.stage;
  const std::vector<std::int64_t> counts = counts_of(saved.host_offsets);
  const std::size_t El = counts.size();
  // x's scale is fc's (up shares its scale state, so its scale is the same value).
  const tensor_parallel::Fp8Linear::Scales fc =
      fp8_.fc.forward_scales(rows, w.fc, stage, record, s);
  const tensor_parallel::Fp8Linear::Scales up =
      up_ != nullptr ? fp8_.up.forward_scales(rows, w.up, stage, record, s)
                     : tensor_parallel::Fp8Linear::Scales{};
  saved.rows = rows;
  const std::int64_t width = w.fc.size(1);  // F / etp
  saved.fc_out = Tensor::empty({rows.size(0), width}, rows.dtype(), rows.device(), s);
  if (up_ != nullptr) {
    saved.up_out = Tensor::empty({rows.size(0), width}, rows.dtype(), rows.device(), s);
  }
  saved.fp8.assign(El, ExpertsActivations::Fp8Saved{});
  std::vector<Tensor> h(El);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    ExpertsActivations::Fp8Saved& f = saved.fp8[i];
    // Every expert's weights are cast (an idle one's too: delayed scaling records their amax).
    const nn::Fp8Tensor qfc = cast(w.fc.select(le), fc.w, nn::Fp8Format::e4m3, s);
    const nn::Fp8Tensor qup =
        up_ != nullptr ? cast(w.up.select(le), up.w, nn::Fp8Format::e4m3, s) : nn::Fp8Tensor{};
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    const nn::Fp8Tensor qx = cast(rows.narrow(0, off, n), fc.x, nn::Fp8Format::e4m3, s);
    const Tensor a = saved.fc_out.narrow(0, off, n);
    gemm_into(qx, qfc, a, true, s);
    if (up_ != nullptr) {
      const Tensor u = saved.up_out.narrow(0, off, n);
      gemm_into(qx, qup, u, true, s);
      h[i] = nn::swiglu_forward(a, u, s);
      f.up_t = transposed(qup);
    } else {
      h[i] = nn::gelu_forward(a, s);
    }
    f.x_t = transposed(qx);
    f.fc_t = transposed(qfc);
    off += n;
  }
  // proj's input: one scale over every expert's rows.
  const tensor_parallel::Fp8Linear::Scales proj =
      fp8_.proj.forward_scales(join(h, counts, w.proj.size(2), rows, s), w.proj, stage, record, s);
  Tensor y = Tensor::empty({rows.size(0), rows.size(1)}, rows.dtype(), rows.device(), s);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const nn::Fp8Tensor qproj = cast(w.proj.select(le), proj.w, nn::Fp8Format::e4m3, s);
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    const nn::Fp8Tensor qh = cast(h[i], proj.x, nn::Fp8Format::e4m3, s);
    y.narrow(0, off, n).copy_(gemm(qh, qproj, rows, true, s), s);
    saved.fp8[i].h_t = transposed(qh);
    saved.fp8[i].proj_t = transposed(qproj);
    off += n;
  }
  return y;
}

Tensor Experts::backward_fp8(const Tensor& dy, const ExpertsActivations& saved,
                             const std::vector<Tensor>& grads, const Stream& s) {
  Communicator& stage = *fp8_.stage;
  const std::vector<std::int64_t> counts = counts_of(saved.host_offsets);
  const std::size_t El = counts.size();
  const tensor_parallel::Fp8Linear::Scale dy_scale = fp8_.proj.output_grad_scale(dy, stage, s);
  // proj's dgrad and wgrad, then the gradients of fc's (and up's) outputs.
  std::vector<Tensor> da(El), du(El);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    const ExpertsActivations::Fp8Saved& f = saved.fp8[i];
    const nn::Fp8Tensor qdy = cast(dy.narrow(0, off, n), dy_scale, nn::Fp8Format::e5m2, s);
    nn::fp8_gemm(transposed(qdy), f.h_t, Tensor(), grads[2].select(le), true, false, s);
    const Tensor dh = gemm(qdy, f.proj_t, dy, false, s);
    const Tensor a = saved.fc_out.narrow(0, off, n);
    if (up_ != nullptr) {
      nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, saved.up_out.narrow(0, off, n), s);
      da[i] = std::move(sg.dgate);
      du[i] = std::move(sg.dup);
    } else {
      da[i] = nn::gelu_backward(dh, a, s);
    }
    off += n;
  }
  // fc's and up's output gradients: one scale each over every expert's rows.
  const std::int64_t width = grads[0].size(1);  // F / etp
  const tensor_parallel::Fp8Linear::Scale da_scale =
      fp8_.fc.output_grad_scale(join(da, counts, width, dy, s), stage, s);
  const tensor_parallel::Fp8Linear::Scale du_scale =
      up_ != nullptr ? fp8_.up.output_grad_scale(join(du, counts, width, dy, s), stage, s)
                     : tensor_parallel::Fp8Linear::Scale{};
  Tensor dx = Tensor::empty({dy.size(0), dy.size(1)}, dy.dtype(), dy.device(), s);
  for (std::int64_t le = 0, off = 0; le < local_experts_; ++le) {
    const auto i = static_cast<std::size_t>(le);
    const std::int64_t n = counts[i];
    if (n == 0) continue;
    const ExpertsActivations::Fp8Saved& f = saved.fp8[i];
    const nn::Fp8Tensor qda = cast(da[i], da_scale, nn::Fp8Format::e5m2, s);
    nn::fp8_gemm(transposed(qda), f.x_t, Tensor(), grads[0].select(le), true, false, s);
    Tensor dxo = gemm(qda, f.fc_t, dy, false, s);
    if (up_ != nullptr) {
      const nn::Fp8Tensor qdu = cast(du[i], du_scale, nn::Fp8Format::e5m2, s);
      nn::fp8_gemm(transposed(qdu), f.x_t, Tensor(), grads[1].select(le), true, false, s);
      nn::add_(dxo, gemm(qdu, f.up_t, dy, false, s), 1.0f, s);
    }
    dx.narrow(0, off, n).copy_(dxo, s);
    off += n;
  }
  return dx;
}

}  // namespace quintet::expert
