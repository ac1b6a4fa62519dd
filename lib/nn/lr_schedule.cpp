// Learning-rate schedules (see lr_schedule.hpp for the exact rules).
#include "quintet/nn/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "quintet/core/error.hpp"

namespace quintet::nn {

void LrSchedule::validate() const {
  QUINTET_CHECK(peak_lr > 0 && min_lr >= 0 && min_lr <= peak_lr,
                "LrSchedule: peak_lr {} and min_lr {}: need peak_lr > 0 and 0 <= min_lr <= "
                "peak_lr",
                peak_lr, min_lr);
  QUINTET_CHECK(warmup_steps >= 0 && total_steps >= 1,
                "LrSchedule: warmup_steps {} (>= 0) and total_steps {} (>= 1)", warmup_steps,
                total_steps);
  QUINTET_CHECK(kind != Kind::wsd || (decay_fraction > 0 && decay_fraction <= 1),
                "LrSchedule: wsd decay_fraction {} must be in (0, 1]", decay_fraction);
}

float LrSchedule::at(std::int64_t step) const {
  validate();
  QUINTET_CHECK(step >= 0, "LrSchedule::at: step {} is negative (steps count from 0)", step);
  const std::int64_t t = std::min(step, total_steps - 1);
  const std::int64_t w = warmup_steps;
  if (t < w) return peak_lr * static_cast<float>(t + 1) / static_cast<float>(w);
  const std::int64_t after = total_steps - w;  // steps from the end of warmup to the end
  if (kind == Kind::constant || after <= 1) return peak_lr;
  const double peak = peak_lr, low = min_lr;
  if (kind == Kind::wsd) {
    const std::int64_t k = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::llround(decay_fraction * static_cast<double>(after))));
    const std::int64_t decay_start = total_steps - k;
    if (t < decay_start) return peak_lr;
    const double p = static_cast<double>(t - decay_start + 1) / static_cast<double>(k);
    return static_cast<float>(peak + (low - peak) * p);
  }
  const double p = static_cast<double>(t - w) / static_cast<double>(after - 1);
  if (kind == Kind::linear) return static_cast<float>(peak + (low - peak) * p);
  return static_cast<float>(low + (peak - low) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

std::string_view lr_schedule_kind_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::cosine:
      return "cosine";
    case LrSchedule::Kind::linear:
      return "linear";
    default:
      return "wsd";
  }
}

LrSchedule::Kind parse_lr_schedule_kind(std::string_view name) {
  for (LrSchedule::Kind k : {LrSchedule::Kind::constant, LrSchedule::Kind::cosine,
                             LrSchedule::Kind::linear, LrSchedule::Kind::wsd}) {
    if (name == lr_schedule_kind_name(k)) return k;
  }
  QUINTET_THROW(InvalidArgument,
                "unknown learning-rate schedule '{}': expected constant, cosine, linear or wsd",
                name);
}

}  // namespace quintet::nn
