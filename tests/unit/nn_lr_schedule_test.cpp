// The learning-rate schedules (quintet/nn/lr_schedule.hpp) against their closed forms.
#include <cmath>
#include <numbers>

#include "quintet/nn/lr_schedule.hpp"
#include "support/catch.hpp"

using namespace quintet;
using nn::LrSchedule;

namespace {
LrSchedule make(LrSchedule::Kind kind, std::int64_t warmup, std::int64_t total) {
  LrSchedule s;
  s.kind = kind;
  s.peak_lr = 1.0f;
  s.min_lr = 0.1f;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return s;
}
}  // namespace

TEST_CASE("lr schedules: warmup is linear up to the peak", "[nn]") {
  for (auto kind : {LrSchedule::Kind::constant, LrSchedule::Kind::cosine, LrSchedule::Kind::linear,
                    LrSchedule::Kind::wsd}) {
    const LrSchedule s = make(kind, 4, 20);
    INFO(nn::lr_schedule_kind_name(kind));
    CHECK(s.at(0) == Approx(0.25));
    CHECK(s.at(1) == Approx(0.5));
    CHECK(s.at(3) == Approx(1.0));
    CHECK(s.at(4) == Approx(1.0));  // the first step after warmup is at the peak
  }
}

TEST_CASE("lr schedules: cosine, linear, constant and wsd after warmup", "[nn]") {
  // 10 warmup, 21 steps after it: p = (t - 10) / 20.
  const LrSchedule cosine = make(LrSchedule::Kind::cosine, 10, 31);
  const LrSchedule linear = make(LrSchedule::Kind::linear, 10, 31);
  for (std::int64_t t = 10; t < 31; ++t) {
    const double p = (t - 10) / 20.0;
    CHECK(cosine.at(t) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * p))));
    CHECK(linear.at(t) == Approx(1.0 - 0.9 * p));
  }
  CHECK(cosine.at(20) == Approx(0.55));  // halfway
  CHECK(cosine.at(30) == Approx(0.1));   // the last step is min_lr
  CHECK(cosine.at(500) == Approx(0.1));  // and stays there
  CHECK(make(LrSchedule::Kind::constant, 10, 31).at(30) == Approx(1.0));

  // wsd: 20 steps after warmup, decay_fraction 0.25: the last 5 steps fall to min_lr.
  LrSchedule wsd = make(LrSchedule::Kind::wsd, 10, 30);
  wsd.decay_fraction = 0.25;
  for (std::int64_t t = 10; t < 25; ++t) CHECK(wsd.at(t) == Approx(1.0));
  for (std::int64_t i = 0; i < 5; ++i) CHECK(wsd.at(25 + i) == Approx(1.0 - 0.9 * (i + 1) / 5.0));
  CHECK(wsd.at(29) == Approx(0.1));

  // No room to decay: the peak.
  CHECK(make(LrSchedule::Kind::cosine, 3, 4).at(3) == Approx(1.0));
  CHECK(make(LrSchedule::Kind::cosine, 0, 1).at(0) == Approx(1.0));
}

TEST_CASE("lr schedules: bad settings are refused with their names", "[nn]") {
  LrSchedule s = make(LrSchedule::Kind::cosine, 0, 10);
  s.min_lr = 2.0f;
  REQUIRE_THROWS_QUINTET(s.at(0), InvalidArgument, "0 <= min_lr <= peak_lr");
  s = make(LrSchedule::Kind::cosine, -1, 10);
  REQUIRE_THROWS_QUINTET(s.validate(), InvalidArgument, "warmup_steps -1");
  s = make(LrSchedule::Kind::wsd, 0, 10);
  s.decay_fraction = 0.0;
  REQUIRE_THROWS_QUINTET(s.validate(), InvalidArgument, "decay_fraction 0 must be in (0, 1]");
  REQUIRE_THROWS_QUINTET(make(LrSchedule::Kind::cosine, 0, 10).at(-1), InvalidArgument,
                         "step -1 is negative");
  REQUIRE_THROWS_QUINTET(nn::parse_lr_schedule_kind("step"), InvalidArgument,
                         "expected constant, cosine, linear or wsd");
  CHECK(nn::parse_lr_schedule_kind("wsd") == LrSchedule::Kind::wsd);
}
