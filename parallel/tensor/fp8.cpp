// FP8 tp linear layers: the per-call scaling of Fp8Linear and the end of a step's scaling.
#include "quintet/parallel/tensor/fp8.hpp"

#include <cstdint>

namespace quintet {

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
}  // namespace

void fp8_end_step(const std::vector<nn::Fp8TensorScale*>& scales,
                  const std::vector<Communicator*>& groups, const Stream& stream) {
  std::vector<nn::Fp8TensorScale*> delayed;
  for (nn::Fp8TensorScale* s : scales) {
    if (current(*s)) {
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
}

Fp8Linear::Inputs Fp8Linear::forward(const Tensor& x, const Tensor& w, Communicator& tp,
                                     bool record, const Stream& stream) {
  if (!on()) return {x, w};
  std::vector<float> amax{nn::fp8_amax(x, stream), nn::fp8_amax(w, stream)};
  if (x_->uses_amax() || w_->uses_amax()) amax = max_over(std::move(amax), tp, stream);
  const float sx = x_->scale(amax[0], record);
  w_scale_ = w_->scale(amax[1], record);
  return {nn::fp8_round_trip(x, sx, x_->format(), stream), weight(w, stream)};
}

Tensor Fp8Linear::weight(const Tensor& w, const Stream& stream) const {
  return on() ? nn::fp8_round_trip(w, w_scale_, w_->format(), stream) : w;
}

Tensor Fp8Linear::output_grad(const Tensor& dy, Communicator& tp, const Stream& stream) {
  if (!on()) return dy;
  std::vector<float> amax{nn::fp8_amax(dy, stream)};
  if (dy_->uses_amax()) amax = max_over(std::move(amax), tp, stream);
  return nn::fp8_round_trip(dy, dy_->scale(amax[0]), dy_->format(), stream);
}

}  // namespace quintet
