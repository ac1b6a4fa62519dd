// LrSchedule: the learning rate at each optimizer step of a run (lib/nn/lr_schedule.cpp). A pure
// value: set it once, ask at(step) every step and give the result to the optimizer's set_lr.
//
// Every kind starts with a linear warmup over warmup_steps (step t < warmup_steps gets
// peak_lr * (t + 1) / warmup_steps), then, with T = total_steps and W = warmup_steps:
//   constant  peak_lr.
//   cosine    min_lr + (peak_lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (t - W) / (T - W - 1):
//             peak_lr at step W, min_lr at the last step T - 1.
//   linear    peak_lr + (min_lr - peak_lr) * p, the same p.
//   wsd       warmup-stable-decay: peak_lr until the last K = max(1, round(decay_fraction *
//             (T - W))) steps, which fall linearly to min_lr: step T - K + i (i = 0 .. K - 1)
//             gets peak_lr + (min_lr - peak_lr) * (i + 1) / K, so the last step is min_lr.
// With T - W <= 1 the decaying kinds stay at peak_lr after warmup. Steps at or past T keep the
// last step's rate.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace quintet::nn {

struct LrSchedule {
  enum class Kind { constant, cosine, linear, wsd };
  Kind kind = Kind::cosine;
  float peak_lr = 1e-3f;
  float min_lr = 0.0f;            // the decaying kinds' rate at the last step
  std::int64_t warmup_steps = 0;  // >= 0
  std::int64_t total_steps = 1;   // >= 1: the run's optimizer steps
  double decay_fraction = 0.2;    // wsd: the share of the post-warmup steps that decay, (0, 1]

  // Throws InvalidArgument naming the field unless peak_lr > 0, 0 <= min_lr <= peak_lr,
  // warmup_steps >= 0, total_steps >= 1, and (wsd) 0 < decay_fraction <= 1.
  void validate() const;
  // The rate at optimizer step `step` (0-based; >= 0, else InvalidArgument).
  float at(std::int64_t step) const;
};

// "constant", "cosine", "linear", "wsd"; parse throws InvalidArgument listing them.
std::string_view lr_schedule_kind_name(LrSchedule::Kind kind);
LrSchedule::Kind parse_lr_schedule_kind(std::string_view name);

}  // namespace quintet::nn
