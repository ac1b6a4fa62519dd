// The bound-by verdict: what one step's wall time (or a run's, summed over its steps) went to, from
// what is already measured (parallel/train/bound_by.cpp), e.g.
//
//   bound by: compute 81%, exposed dp 9%, exposed tp 6%, input 3%, other 1% of 12.4 ms/step
//
//   train::StepTimes run;
//   for (step ...) run += train::step_times(model.step(loader));
//   fmt::print("{}\n", train::bound_by(run).str());
//
// The parts, in the order they are taken from the step's time:
//   exposed dp, tp, pp, cp, ep  the time the compute stream (CPU: thread) waited for each kind of
//                               communication (StepStats' AxisCommunication::exposed_ms);
//   input                       the data loader: the host blocked in next() on a batch not yet
//                               read, and on a GPU the stream's wait for the batch's copy;
//   host                        GPU only: the step's wall time outside the stream's busy span
//                               (launching its first work, waking from its host synchronisation);
//   compute                     the measured busy time (CPU: the step thread's CPU time; GPU: the
//                               stream's span less the waits above measured on it), cut to what
//                               the waits leave (a wait that spins burns CPU time too);
//   other                       the rest: time neither measured waiting nor busy (a CPU rank's
//                               thread descheduled on a shared core, collectives no meter sees,
//                               such as the gradient norm's and the loss's, launch gaps inside a
//                               GPU stream's span are counted as compute).
// When the measured waits exceed the step (the clocks of different meters disagree), each is scaled
// down in proportion so that they fill it, and compute and other are 0. The parts always add up to
// the step time.
#pragma once

#include <array>
#include <string>

#include "quintet/parallel/train/step.hpp"

namespace quintet::train {

// What one step (or several, summed) measured, in milliseconds. Every figure >= 0.
struct StepTimes {
  double step_ms = 0.0;                // wall time
  double busy_ms = 0.0;                // compute, as measured (see above)
  std::array<double, 5> exposed_ms{};  // per kind, in kBoundKinds' order: dp, tp, pp, cp, ep
  double input_ms = 0.0;
  double host_ms = 0.0;
  StepTimes& operator+=(const StepTimes& o);
};
inline constexpr std::array<const char*, 5> kBoundKinds = {"dp", "tp", "pp", "cp", "ep"};

// The times StepStats holds (filled by TrainingModel::step).
StepTimes step_times(const StepStats& s);

struct BoundBy {
  struct Part {
    std::string name;       // "compute", "exposed dp" .. "exposed ep", "input", "host", "other"
    double ms = 0.0;        // its share of step_ms
    double fraction = 0.0;  // ms / step_ms (0 when step_ms is 0)
  };
  double step_ms = 0.0;
  // All nine parts, largest first (ties in the order compute, exposed dp, tp, pp, cp, ep, input,
  // host, other); their ms add up to step_ms.
  std::array<Part, 9> parts;
  // The largest part: what bounded the step.
  const Part& bound() const { return parts.front(); }
  // "bound by: compute 81%, exposed dp 9%, input 0% of 12.4 ms/step": compute and input always,
  // the others when not 0; steps: how many steps step_ms sums (the figure printed is per step).
  std::string str(long long steps = 1) const;
};

// The verdict over t. Throws InvalidArgument for a negative or non-finite figure.
BoundBy bound_by(const StepTimes& t);

}  // namespace quintet::train
