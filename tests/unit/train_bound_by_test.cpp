// train::bound_by: the parts of a step's time add up to it, the waits come first and are scaled
// down when they exceed the step, compute is cut to what they leave, the rest is "other", the
// parts are largest first (ties in the canonical order), and bad figures are refused.
#include <cmath>
#include <limits>
#include <string>

#include "quintet/parallel/train/bound_by.hpp"
#include "support/catch.hpp"

using namespace quintet;
using train::bound_by;
using train::StepTimes;

namespace {

double sum(const train::BoundBy& v) {
  double s = 0.0;
  for (const auto& p : v.parts) s += p.ms;
  return s;
}

double ms_of(const train::BoundBy& v, const std::string& name) {
  for (const auto& p : v.parts) {
    if (p.name == name) return p.ms;
  }
  FAIL("no part " << name);
  return 0.0;
}

}  // namespace

TEST_CASE("bound_by: the parts add up to the step, largest first", "[train]") {
  StepTimes t;
  t.step_ms = 100.0;
  t.busy_ms = 80.0;
  t.exposed_ms = {9.0, 6.0, 0.0, 0.0, 0.0};  // dp, tp
  t.input_ms = 1.0;
  const train::BoundBy v = bound_by(t);
  CHECK(sum(v) == Approx(100.0));
  CHECK(v.bound().name == "compute");
  CHECK(ms_of(v, "compute") == Approx(80.0));
  CHECK(ms_of(v, "exposed dp") == Approx(9.0));
  CHECK(ms_of(v, "exposed tp") == Approx(6.0));
  CHECK(ms_of(v, "input") == Approx(1.0));
  CHECK(ms_of(v, "other") == Approx(4.0));  // 100 - 80 - 9 - 6 - 1: measured by nothing
  CHECK(v.parts[0].fraction == Approx(0.80));
  // Largest first; equal ones (the zeros) in the canonical order.
  const char* order[] = {"compute",    "exposed dp", "exposed tp", "other", "input",
                         "exposed pp", "exposed cp", "exposed ep", "host"};
  for (std::size_t i = 0; i < v.parts.size(); ++i) CHECK(v.parts[i].name == order[i]);
  CHECK(v.str() ==
        "bound by: compute 80%, exposed dp 9%, exposed tp 6%, other 4%, input 1% of 100.0 ms/step");
  CHECK(v.str(4) ==
        "bound by: compute 80%, exposed dp 9%, exposed tp 6%, other 4%, input 1% of 25.0 ms/step");
}

TEST_CASE("bound_by: compute is cut to what the waits leave", "[train]") {
  StepTimes t;
  t.step_ms = 50.0;
  t.busy_ms = 45.0;  // a wait that spun counted its CPU time as busy too
  t.input_ms = 30.0;
  t.host_ms = 5.0;
  const train::BoundBy v = bound_by(t);
  CHECK(sum(v) == Approx(50.0));
  CHECK(v.bound().name == "input");
  CHECK(ms_of(v, "input") == Approx(30.0));
  CHECK(ms_of(v, "compute") == Approx(15.0));
  CHECK(ms_of(v, "host") == Approx(5.0));
  CHECK(ms_of(v, "other") == 0.0);
  CHECK(v.str() == "bound by: input 60%, compute 30%, host 10% of 50.0 ms/step");
}

TEST_CASE("bound_by: waits beyond the step are scaled down to fill it", "[train]") {
  StepTimes t;
  t.step_ms = 10.0;
  t.busy_ms = 7.0;
  t.exposed_ms = {0.0, 0.0, 4.0, 0.0, 12.0};  // pp 4, ep 12: 16 ms in a 10 ms step
  const train::BoundBy v = bound_by(t);
  CHECK(sum(v) == Approx(10.0));
  CHECK(ms_of(v, "exposed ep") == Approx(7.5));
  CHECK(ms_of(v, "exposed pp") == Approx(2.5));
  CHECK(ms_of(v, "compute") == 0.0);
  CHECK(ms_of(v, "other") == 0.0);
  CHECK(v.parts[0].name == "exposed ep");
  CHECK(v.parts[1].name == "exposed pp");
}

TEST_CASE("bound_by: summed steps, an empty step, bad figures", "[train]") {
  StepTimes a, b;
  a.step_ms = 10.0;
  a.busy_ms = 10.0;
  b.step_ms = 30.0;
  b.busy_ms = 2.0;
  b.input_ms = 28.0;
  a += b;
  CHECK(a.step_ms == 40.0);
  const train::BoundBy v = bound_by(a);
  CHECK(v.bound().name == "input");
  CHECK(v.bound().fraction == Approx(0.7));
  CHECK(sum(v) == Approx(40.0));

  const train::BoundBy empty = bound_by(StepTimes{});
  CHECK(sum(empty) == 0.0);
  for (const auto& p : empty.parts) CHECK(p.fraction == 0.0);

  StepTimes bad;
  bad.step_ms = 10.0;
  bad.input_ms = -1.0;
  REQUIRE_THROWS_QUINTET(bound_by(bad), InvalidArgument, "input -1 ms");
  bad.input_ms = 0.0;
  bad.exposed_ms[1] = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_QUINTET(bound_by(bad), InvalidArgument, "bound_by: tp nan ms");
  bad.exposed_ms[1] = 0.0;
  bad.step_ms = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_QUINTET(bound_by(bad), InvalidArgument, "step inf ms");
}
