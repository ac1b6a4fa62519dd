// The MoE layer's expert MLPs (quintet/parallel/expert/experts.hpp): each projection one grouped
// linear op over every local expert's block of rows (FP8: the grouped FP8 ops). The weight
// gradients of backward's first call of a step overwrite the stale gradients (lazy zeroing,
// quintet/nn/parameter.hpp; MoELayer passes the flags): the grouped weight-gradient ops with
// accumulate = false write every expert's block, an expert without rows zeroed. The per-expert
// loop (the GPU's default for bf16 / f32) and the CPU write without reading dw; the grouped GPU
// kernels add in their epilogue, so there the op zero-fills dw first, as before.
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
// x [rows, cols] in FP8 at scale.scale (recording its amax into scale.amax when defined), with
// its transpose for backward's GEMMs.
nn::Fp8Tensor cast(const Tensor& x, const tensor_parallel::Fp8Linear::Scale& scale,
                   nn::Fp8Format format, const Stream& s) {
  return nn::fp8_cast(x.contiguous(s), scale.scale, format, true, scale.amax, s);
}
// What backward's GEMMs read of q: its transpose and scale (the data dropped).
nn::Fp8Tensor transposes(const nn::Fp8Tensor& q) {
  return nn::Fp8Tensor{Tensor(), q.transposed, q.scale, q.format};
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
                        ExpertsActivations& saved, bool record, const Stream& s) {
  QUINTET_CHECK(offsets.defined() && offsets.dim() == 1 && offsets.size(0) == local_experts_ + 1,
                "Experts::forward: offsets are {}; expected [{}] (local experts + 1)",
                offsets.defined() ? shape_str(offsets.shape()) : std::string("undefined"),
                local_experts_ + 1);
  saved = ExpertsActivations{};
  saved.offsets = offsets;
  if (!rows.device().is_cpu() && nn::grouped_gemm_wants_host_offsets()) {
    // The per-expert cuBLASLt loop (the default, FP8 too), on the offsets read here (a wait).
    const Tensor host = offsets.to(Device::cpu(), s);
    s.synchronize();
    const std::int64_t* o = host.data<std::int64_t>();
    saved.host_offsets.assign(o, o + host.numel());
  }
  if (fp8_.fc.on()) return forward_fp8(w, rows, saved, record, s);
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
                         const std::vector<Tensor>& grads, const std::vector<bool>& overwrite,
                         const Stream& s) {
  QUINTET_CHECK(grads.size() == 3 && overwrite.size() == 3,
                "Experts::backward: {} gradients and {} overwrite flags; expected 3 (fc, up, proj)",
                grads.size(), overwrite.size());
  if (fp8_.fc.on()) return backward_fp8(dy, saved, grads, overwrite, s);
  const Tensor& o = saved.offsets;
  const std::span<const std::int64_t> ho = saved.host_offsets;
  const Tensor& xs = saved.rows;
  const Tensor& a = saved.fc_out;
  const Tensor& u = saved.up_out;
  const Tensor h = up_ != nullptr ? nn::swiglu_forward(a, u, s) : nn::gelu_forward(a, s);
  nn::grouped_linear_backward_weight(dy, h, o, grads[2], ho, !overwrite[2], s);
  const Tensor dh = nn::grouped_linear_backward_input(dy, w.proj, o, ho, s);
  if (up_ != nullptr) {
    const nn::SwiGluGrads sg = nn::swiglu_backward(dh, a, u, s);
    nn::grouped_linear_backward_weight(sg.dgate, xs, o, grads[0], ho, !overwrite[0], s);
    nn::grouped_linear_backward_weight(sg.dup, xs, o, grads[1], ho, !overwrite[1], s);
    Tensor dx = nn::grouped_linear_backward_input(sg.dgate, w.fc, o, ho, s);
    nn::add_(dx, nn::grouped_linear_backward_input(sg.dup, w.up, o, ho, s), 1.0f, s);
    return dx;
  }
  const Tensor da = nn::gelu_backward(dh, a, s);
  nn::grouped_linear_backward_weight(da, xs, o, grads[0], ho, !overwrite[0], s);
  return nn::grouped_linear_backward_input(da, w.fc, o, ho, s);
}

// ---- FP8: whole-tensor nn::fp8_cast (one scale over every expert) and the grouped FP8 GEMMs, at
// the per-tensor scales of Fp8Linear's device-scale calls ----

Tensor Experts::forward_fp8(const ExpertWeights& w, const Tensor& rows, ExpertsActivations& saved,
                            bool record, const Stream& s) {
  Communicator& stage = *fp8_.stage;
  const Tensor& o = saved.offsets;
  const std::span<const std::int64_t> ho = saved.host_offsets;
  // The forward's fast accumulation into bf16, as the tp layers' (tensor_parallel/linear.cpp).
  const bool fast = rows.dtype() == DType::bf16;
  // x's scale is fc's (up shares its scale state, so its scale is the same value).
  const tensor_parallel::Fp8Linear::Scales fc =
      fp8_.fc.forward_scales(rows, w.fc, stage, record, s);
  const tensor_parallel::Fp8Linear::Scales up =
      up_ != nullptr ? fp8_.up.forward_scales(rows, w.up, stage, record, s)
                     : tensor_parallel::Fp8Linear::Scales{};
  saved.rows = rows;
  ExpertsActivations::Fp8Saved& f = saved.fp8;
  const nn::Fp8Tensor qx = cast(rows, fc.x, nn::Fp8Format::e4m3, s);
  // Every expert's weights are cast (an idle one's too: delayed scaling records their amax).
  const nn::Fp8Tensor qfc = cast(w.fc, fc.w, nn::Fp8Format::e4m3, s);
  saved.fc_out = nn::grouped_fp8_linear_forward(qx, qfc, o, ho, rows.dtype(), fast, s);
  Tensor h;
  if (up_ != nullptr) {
    const nn::Fp8Tensor qup = cast(w.up, up.w, nn::Fp8Format::e4m3, s);
    saved.up_out = nn::grouped_fp8_linear_forward(qx, qup, o, ho, rows.dtype(), fast, s);
    h = nn::swiglu_forward(saved.fc_out, saved.up_out, s);
    f.up_t = transposes(qup);
  } else {
    h = nn::gelu_forward(saved.fc_out, s);
  }
  f.x_t = transposes(qx);
  f.fc_t = transposes(qfc);
  // proj's input: one scale over every expert's rows (padding rows are zero: they add nothing).
  const tensor_parallel::Fp8Linear::Scales proj =
      fp8_.proj.forward_scales(h, w.proj, stage, record, s);
  const nn::Fp8Tensor qh = cast(h, proj.x, nn::Fp8Format::e4m3, s);
  const nn::Fp8Tensor qproj = cast(w.proj, proj.w, nn::Fp8Format::e4m3, s);
  f.h_t = transposes(qh);
  f.proj_t = transposes(qproj);
  return nn::grouped_fp8_linear_forward(qh, qproj, o, ho, rows.dtype(), fast, s);
}

Tensor Experts::backward_fp8(const Tensor& dy, const ExpertsActivations& saved,
                             const std::vector<Tensor>& grads, const std::vector<bool>& overwrite,
                             const Stream& s) {
  Communicator& stage = *fp8_.stage;
  const Tensor& o = saved.offsets;
  const std::span<const std::int64_t> ho = saved.host_offsets;
  const ExpertsActivations::Fp8Saved& f = saved.fp8;
  const Tensor dyc = dy.contiguous(s);
  const tensor_parallel::Fp8Linear::Scale dy_scale = fp8_.proj.output_grad_scale(dyc, stage, s);
  // proj's wgrad and dgrad, then the gradients of fc's (and up's) outputs.
  const nn::Fp8Tensor qdy = cast(dyc, dy_scale, nn::Fp8Format::e5m2, s);
  nn::grouped_fp8_linear_backward_weight(qdy, f.h_t, o, grads[2], ho, !overwrite[2], s);
  const Tensor dh = nn::grouped_fp8_linear_backward_input(qdy, f.proj_t, o, ho, dy.dtype(), s);
  Tensor da, du;
  if (up_ != nullptr) {
    nn::SwiGluGrads sg = nn::swiglu_backward(dh, saved.fc_out, saved.up_out, s);
    da = std::move(sg.dgate);
    du = std::move(sg.dup);
  } else {
    da = nn::gelu_backward(dh, saved.fc_out, s);
  }
  // fc's and up's output gradients: one scale each over every expert's rows.
  const tensor_parallel::Fp8Linear::Scale da_scale = fp8_.fc.output_grad_scale(da, stage, s);
  const nn::Fp8Tensor qda = cast(da, da_scale, nn::Fp8Format::e5m2, s);
  nn::grouped_fp8_linear_backward_weight(qda, f.x_t, o, grads[0], ho, !overwrite[0], s);
  Tensor dx = nn::grouped_fp8_linear_backward_input(qda, f.fc_t, o, ho, dy.dtype(), s);
  if (up_ != nullptr) {
    const tensor_parallel::Fp8Linear::Scale du_scale = fp8_.up.output_grad_scale(du, stage, s);
    const nn::Fp8Tensor qdu = cast(du, du_scale, nn::Fp8Format::e5m2, s);
    nn::grouped_fp8_linear_backward_weight(qdu, f.x_t, o, grads[1], ho, !overwrite[1], s);
    nn::add_(dx, nn::grouped_fp8_linear_backward_input(qdu, f.up_t, o, ho, dy.dtype(), s), 1.0f, s);
  }
  return dx;
}

}  // namespace quintet::expert
