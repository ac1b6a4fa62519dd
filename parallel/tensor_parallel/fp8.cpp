// FP8 tp linear layers: the per-call scaling of Fp8Linear and the end of a step's scaling.
#include "quintet/parallel/tensor_parallel/fp8.hpp"

#include <cstdint>

#include "quintet/core/error.hpp"

namespace quintet::tensor_parallel {

namespace {
// The amaxes reduced (max) over comm, in one all-reduce.
std::vector<float> max_over(std::vector<float> amax, Communicator& comm, const Stream& stream) {
  if (comm.size() == 1 || amax.empty()) return amax;
  const Tensor t =
      Tensor::from_vector(amax, {static_cast<std::int64_t>(amax.size())}, Device::cpu());
  comm.all_reduce(t, ReduceOp::max, stream).wait(stream);
  return std::vector<float>(t.data<float>(), t.data<float>() + amax.size());
}
bool current(const nn::Fp8TensorScale& s) { return s.recipe().scaling == nn::Fp8Scaling::current; }

// The amaxes (f32 [n] on the device) reduced (max) over tp when any of the scales uses them.
void max_over_device(const Tensor& amax, bool any_uses_amax, Communicator& tp,
                     const Stream& stream) {
  if (tp.size() > 1 && any_uses_amax) tp.all_reduce(amax, ReduceOp::max, stream).wait(stream);
}

// x through FP8 and back at a device scale, in x's dtype.
Tensor round_trip(const Tensor& x, const Fp8Linear::Scale& scale, nn::Fp8Format format,
                  const Stream& stream) {
  return nn::fp8_dequantize(nn::fp8_cast(x, scale.scale, format, false, scale.amax, stream),
                            x.dtype(), stream);
}

// fp8_end_step of the scales on a device: their step amaxes gathered into one device tensor,
// reduced over each group (when any is delayed), read back once, then each ended on the host
// with its device state reset.
void end_device_step(const std::vector<nn::Fp8TensorScale*>& scales,
                     const std::vector<Communicator*>& groups, const Stream& stream) {
  const auto n = static_cast<std::int64_t>(scales.size());
  const Tensor amax = Tensor::empty({n}, DType::f32, scales[0]->device_state().device(), stream);
  bool any_delayed = false;
  for (std::int64_t i = 0; i < n; ++i) {
    amax.narrow(0, i, 1).copy_(scales[i]->device_state().narrow(0, 1, 1), stream);
    any_delayed = any_delayed || !current(*scales[i]);
  }
  if (any_delayed) {
    for (Communicator* g : groups) {
      if (g->size() > 1) g->all_reduce(amax, ReduceOp::max, stream).wait(stream);
    }
  }
  const Tensor host = amax.to(Device::cpu(), stream);
  stream.synchronize();
  for (std::int64_t i = 0; i < n; ++i) scales[i]->end_device_step(host.data<float>()[i], stream);
}
}  // namespace

void fp8_end_step(const std::vector<nn::Fp8TensorScale*>& scales,
                  const std::vector<Communicator*>& groups, const Stream& stream) {
  std::vector<nn::Fp8TensorScale*> delayed, on_device;
  for (nn::Fp8TensorScale* s : scales) {
    if (s->on_device()) {
      on_device.push_back(s);
    } else if (current(*s)) {
      s->end_step();
    } else {
      delayed.push_back(s);
    }
  }
  std::vector<float> amax;
  for (const nn::Fp8TensorScale* s : delayed) amax.push_back(s->step_amax());
  for (Communicator* g : groups) amax = max_over(std::move(amax), *g, stream);
  for (std::size_t i = 0; i < delayed.size(); ++i) {
    delayed[i]->set_step_amax(amax[i]);
    delayed[i]->end_step();
  }
  if (!on_device.empty()) end_device_step(on_device, groups, stream);
}

Fp8Linear::Scales Fp8Linear::forward_scales(const Tensor& x, const Tensor& w, Communicator& tp,
                                            bool record, const Stream& stream) {
  if (!x_->uses_amax() && !w_->uses_amax()) {  // the delayed scales; the casts record the amaxes
    const std::vector<Tensor> scale =
        nn::Fp8TensorScale::scales_on_device({x_, w_}, Tensor(), false, stream);
    Scales out{{scale[0], Tensor()}, {scale[1], Tensor()}};
    if (record) {
      out.x.amax = x_->step_amax_slot();
      out.w.amax = w_->step_amax_slot();
    }
    return out;
  }
  // Both amaxes in one pass and one launch, both scales in one launch.
  Tensor amax = Tensor::empty({2}, DType::f32, x.device(), stream);
  amax.fill_(0.0, stream);
  nn::fp8_amaxes_into({x, w}, amax, stream);
  max_over_device(amax, true, tp, stream);
  const std::vector<Tensor> scale =
      nn::Fp8TensorScale::scales_on_device({x_, w_}, amax, record, stream);
  return {{scale[0], Tensor()}, {scale[1], Tensor()}};
}

Fp8Linear::Scale Fp8Linear::output_grad_scale(const Tensor& dy, Communicator& tp,
                                              const Stream& stream) {
  if (!dy_->uses_amax()) {  // the delayed scale; the cast records the amax
    return {nn::Fp8TensorScale::scales_on_device({dy_}, Tensor(), false, stream)[0],
            dy_->step_amax_slot()};
  }
  Tensor amax = Tensor::empty({1}, DType::f32, dy.device(), stream);
  amax.fill_(0.0, stream);
  nn::fp8_amax_into(dy, amax, stream);
  max_over_device(amax, true, tp, stream);
  return {dy_->scale_on_device(amax, true, stream), Tensor()};
}

bool Fp8Linear::same_x_scale(const Fp8Linear& a, const Fp8Linear& b) {
  const nn::Fp8TensorScale &xa = *a.x_, &xb = *b.x_;
  if (xa.format() != xb.format() || xa.recipe().margin != xb.recipe().margin) return false;
  if (xa.uses_amax() || xb.uses_amax()) return xa.uses_amax() && xb.uses_amax();
  return xa.delayed_scale() == xb.delayed_scale();
}

Fp8Linear::SharedScales Fp8Linear::shared_forward_scales(Fp8Linear& a, Fp8Linear& b,
                                                         const Tensor& x, const Tensor& wa,
                                                         const Tensor& wb, Communicator& tp,
                                                         bool record, const Stream& stream) {
  QUINTET_CHECK(same_x_scale(a, b),
                "Fp8Linear::shared_forward_scales: {} and {} scale x differently; cast it for each",
                a.x_->what(), b.x_->what());
  if (!a.x_->uses_amax() && !a.w_->uses_amax() && !b.w_->uses_amax()) {  // the delayed scales
    const std::vector<Tensor> scale =
        nn::Fp8TensorScale::scales_on_device({a.x_, a.w_, b.w_}, Tensor(), false, stream);
    SharedScales out{{scale[0], Tensor()}, {scale[1], Tensor()}, {scale[2], Tensor()}, Tensor()};
    if (record) {
      out.x.amax = a.x_->step_amax_slot();
      out.wa.amax = a.w_->step_amax_slot();
      out.wb.amax = b.w_->step_amax_slot();
      out.x_also = b.x_->step_amax_slot();
    }
    return out;
  }
  // x, wa and wb in one amax launch; b's x takes x's amax (the same tensor).
  Tensor amax = Tensor::empty({4}, DType::f32, x.device(), stream);
  amax.fill_(0.0, stream);
  nn::fp8_amaxes_into({x, wa, wb}, amax.narrow(0, 0, 3), stream);
  amax.narrow(0, 3, 1).copy_(amax.narrow(0, 0, 1), stream);
  max_over_device(amax, true, tp, stream);
  const std::vector<Tensor> scale =
      nn::Fp8TensorScale::scales_on_device({a.x_, a.w_, b.w_, b.x_}, amax, record, stream);
  return {{scale[0], Tensor()}, {scale[1], Tensor()}, {scale[2], Tensor()}, Tensor()};
}

Fp8Linear::Inputs Fp8Linear::forward(const Tensor& x, const Tensor& w, Communicator& tp,
                                     bool record, const Stream& stream) {
  if (!on()) return {x, w};
  if (on_device(x)) {
    const Scales s = forward_scales(x, w, tp, record, stream);
    w_scale_device_ = s.w.scale;
    return {round_trip(x, s.x, x_->format(), stream), round_trip(w, s.w, w_->format(), stream)};
  }
  std::vector<float> amax{nn::fp8_amax(x, stream), nn::fp8_amax(w, stream)};
  if (x_->uses_amax() || w_->uses_amax()) amax = max_over(std::move(amax), tp, stream);
  const float sx = x_->scale(amax[0], record);
  w_scale_ = w_->scale(amax[1], record);
  return {nn::fp8_round_trip(x, sx, x_->format(), stream), weight(w, stream)};
}

Tensor Fp8Linear::weight(const Tensor& w, const Stream& stream) const {
  if (!on()) return w;
  if (on_device(w)) return round_trip(w, {w_scale_device_, Tensor()}, w_->format(), stream);
  return nn::fp8_round_trip(w, w_scale_, w_->format(), stream);
}

Tensor Fp8Linear::output_grad(const Tensor& dy, Communicator& tp, const Stream& stream) {
  if (!on()) return dy;
  if (on_device(dy))
    return round_trip(dy, output_grad_scale(dy, tp, stream), dy_->format(), stream);
  std::vector<float> amax{nn::fp8_amax(dy, stream)};
  if (dy_->uses_amax()) amax = max_over(std::move(amax), tp, stream);
  return nn::fp8_round_trip(dy, dy_->scale(amax[0]), dy_->format(), stream);
}

}  // namespace quintet::tensor_parallel
