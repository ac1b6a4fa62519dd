// The pipeline simulator (parallel/pipeline/simulator.cpp): runs a Schedule on a model of the
// executor (schedule.hpp says what it models) with a cost per action, before anything touches the
// network. It reports a deadlock naming the rank and the action it is stuck at, each rank's
// timeline, the bubble fraction and the peak number of microbatches in flight per rank. Pure.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "quintet/parallel/pipeline/schedule.hpp"  // Schedule, ActionCosts

namespace quintet::pipeline {

struct TimedAction {
  Action action;
  double start = 0.0;
  double end = 0.0;
};

struct Simulation {
  bool deadlock = false;
  // With a deadlock: every stuck rank and the action it waits at, e.g. "rank 1 waits at 1RF3 (the
  // send 0SF3 never comes)" (one line each).
  std::string deadlock_report;
  double makespan = 0.0;            // end of the last action of any rank
  std::vector<double> busy;         // [pp]: compute time of each rank
  double bubble_fraction = 0.0;     // 1 - sum(busy) / (pp * makespan)
  std::vector<int> peak_in_flight;  // [pp]: max (stage, microbatch) pairs between the
                                    // start of their F and the end of their B (or W)
  // [pp]: every action with its times, in list order; a transfer has its batch's start and end.
  // With a deadlock, only the actions that ran.
  std::vector<std::vector<TimedAction>> timeline;
};

// Simulates schedule with costs. The structure is validated first (validate() without the rules on
// transfers); transfers are modelled, not checked: a send or receive without its match, or a
// batch that waits on a later one, is a deadlock. Never throws for a deadlock: it is reported.
Simulation simulate(const Schedule& schedule, const ActionCosts& costs = {});
// The same with costs per stage (stage_costs[s] for the actions of stage s; a transfer takes the
// p2p of the stage that sends it, a batch the largest of its transfers'), for stages that differ
// (the first holds the embedding, the last the head and the loss). InvalidArgument unless there is
// one per stage.
Simulation simulate(const Schedule& schedule, std::span<const ActionCosts> stage_costs);
// The same with a duration for every compute action: compute_durations[r][k] for the k-th
// compute action (F, B, I, W) of rank r's list, and one p2p latency for every batch. Replays a
// measured step (PipelineExecutor's timeline) on the model, so what the model leaves out shows as
// the difference. InvalidArgument unless each rank has one duration >= 0 per compute action.
Simulation simulate(const Schedule& schedule,
                    const std::vector<std::vector<double>>& compute_durations, double p2p = 0.0);

// validate() and simulate(); throws InvalidArgument with the deadlock report when the schedule
// would hang. Executors call it before their first step.
Simulation check_schedule(const Schedule& schedule, const ActionCosts& costs = {});

// The simulated timeline as a Chrome / Perfetto trace (JSON): one process, per rank one thread of
// compute ("rank r", tid r: one complete event per action) and one of its p2p batches ("rank r
// p2p", tid pp + r: one event per batch, named by its transfers). ts and dur are the times times
// 1000, so a cost unit reads as one millisecond.
std::string chrome_trace(const Simulation& simulation);

}  // namespace quintet::pipeline
