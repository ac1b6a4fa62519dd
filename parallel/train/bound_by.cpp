// The bound-by verdict (see bound_by.hpp).
#include "quintet/parallel/train/bound_by.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "quintet/core/error.hpp"

namespace quintet::train {

StepTimes& StepTimes::operator+=(const StepTimes& o) {
  step_ms += o.step_ms;
  busy_ms += o.busy_ms;
  for (std::size_t k = 0; k < exposed_ms.size(); ++k) exposed_ms[k] += o.exposed_ms[k];
  input_ms += o.input_ms;
  host_ms += o.host_ms;
  return *this;
}

StepTimes step_times(const StepStats& s) {
  return {s.time.wall_ms,
          s.time.busy_ms,
          {s.dp.exposed_ms, s.tp.exposed_ms, s.pp.exposed_ms, s.cp.exposed_ms, s.ep.exposed_ms},
          s.time.input_ms,
          s.time.host_ms};
}

BoundBy bound_by(const StepTimes& t) {
  const auto check = [](double v, const char* what) {
    QUINTET_CHECK(std::isfinite(v) && v >= 0.0, "bound_by: {} {} ms: expected a finite time >= 0",
                  what, v);
  };
  check(t.step_ms, "step");
  check(t.busy_ms, "busy");
  for (std::size_t k = 0; k < t.exposed_ms.size(); ++k) check(t.exposed_ms[k], kBoundKinds[k]);
  check(t.input_ms, "input");
  check(t.host_ms, "host");

  BoundBy v;
  v.step_ms = t.step_ms;
  // The waits first (indices 1..7 of the canonical order), then compute (0) and other (8).
  std::array<double, 9> ms{};
  for (std::size_t k = 0; k < t.exposed_ms.size(); ++k) ms[1 + k] = t.exposed_ms[k];
  ms[6] = t.input_ms;
  ms[7] = t.host_ms;
  double waits = 0.0;
  for (std::size_t i = 1; i <= 7; ++i) waits += ms[i];
  if (waits > t.step_ms) {
    for (std::size_t i = 1; i <= 7; ++i) ms[i] *= t.step_ms / waits;
  } else {
    ms[0] = std::min(t.busy_ms, t.step_ms - waits);
    ms[8] = t.step_ms - waits - ms[0];
  }
  static constexpr std::array<const char*, 9> kNames = {"compute",    "exposed dp", "exposed tp",
                                                        "exposed pp", "exposed cp", "exposed ep",
                                                        "input",      "host",       "other"};
  for (std::size_t i = 0; i < ms.size(); ++i) {
    v.parts[i] = {kNames[i], ms[i], t.step_ms > 0.0 ? ms[i] / t.step_ms : 0.0};
  }
  std::stable_sort(v.parts.begin(), v.parts.end(),
                   [](const BoundBy::Part& a, const BoundBy::Part& b) { return a.ms > b.ms; });
  return v;
}

std::string BoundBy::str(long long steps) const {
  std::string s = "bound by:";
  bool first = true;
  for (const Part& p : parts) {
    if (p.ms <= 0.0 && p.name != "compute" && p.name != "input") continue;
    s += fmt::format("{} {} {:.0f}%", first ? "" : ",", p.name, 100.0 * p.fraction);
    first = false;
  }
  return s + fmt::format(" of {:.1f} ms/step", step_ms / static_cast<double>(std::max(steps, 1LL)));
}

}  // namespace quintet::train
