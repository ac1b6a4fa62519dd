// The pipeline simulator: the executor of schedule.hpp as a max-plus system over compute actions
// and comm batches, resolved in dependency order; what cannot be resolved is a deadlock.
#include "quintet/parallel/pipeline/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "quintet/core/error.hpp"
#include "schedule_internal.hpp"

namespace quintet::pipeline {

namespace {

using detail::is_send;

constexpr double kUnknown = -1.0;

struct Batch {
  std::vector<int> ops;  // indices into the rank's action list
  int computes_before;   // computes before the batch in the list; it starts after the last ends
  double start = kUnknown;
  double end = kUnknown;
};

struct Peer {  // where a transfer's match lives
  int rank = -1;
  int batch = -1;
  int op = -1;  // index in that rank's action list
};

struct RankState {
  std::vector<int> computes;  // indices into the action list
  std::vector<Batch> batches;
  std::vector<int> batch_of;        // [action index] -> batch, -1 for computes
  std::vector<Peer> match;          // [action index] -> the matching transfer, rank -1 when none
  std::vector<int> input;           // [compute number] -> action index of its receive, -1 when none
  std::vector<bool> input_missing;  // [compute number]: needs a receive the list does not hold
  std::vector<double> start, end;   // [action index]
  int next_compute = 0;
  int next_batch = 0;
};

double cost_of(ActionKind kind, const ActionCosts& c) {
  switch (kind) {
    case ActionKind::forward:
      return c.forward;
    case ActionKind::backward:
      return c.backward;
    case ActionKind::input_grad:
      return c.backward - c.weight_grad;
    case ActionKind::weight_grad:
      return c.weight_grad;
    default:
      return 0.0;
  }
}

// Splits each rank's list into computes and batches, and pairs every transfer with its match.
std::vector<RankState> build(const Schedule& s) {
  std::vector<RankState> ranks(s.pp);
  // [a][b]: (action index on the owner) of a's sends to b, and of b's receives from a, in order.
  std::vector<std::vector<std::vector<int>>> sends(s.pp, std::vector<std::vector<int>>(s.pp));
  std::vector<std::vector<std::vector<int>>> recvs(s.pp, std::vector<std::vector<int>>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    RankState& st = ranks[r];
    const auto& list = s.actions[r];
    const int n = static_cast<int>(list.size());
    st.batch_of.assign(n, -1);
    st.match.assign(n, Peer{});
    st.start.assign(n, kUnknown);
    st.end.assign(n, kUnknown);
    for (int i = 0; i < n; ++i) {
      const Action& a = list[i];
      if (is_compute(a.kind)) {
        st.computes.push_back(i);
        continue;
      }
      const Action m = detail::matching_transfer(a);
      QUINTET_CHECK(m.stage >= 0 && m.stage < s.num_stages() && s.stage_rank[m.stage] != r,
                    "schedule '{}': rank {} has {}, but its neighbouring stage {} is {}; "
                    "transfers are only written between stages on different ranks",
                    s.name, r, a.str(), m.stage,
                    m.stage < 0 || m.stage >= s.num_stages() ? "not a stage" : "on the same rank");
      if (i == 0 || is_compute(list[i - 1].kind)) {
        st.batches.push_back(Batch{{}, static_cast<int>(st.computes.size())});
      }
      st.batches.back().ops.push_back(i);
      st.batch_of[i] = static_cast<int>(st.batches.size()) - 1;
      const int peer = s.peer(a);
      if (is_send(a.kind)) {
        sends[r][peer].push_back(i);
      } else {
        recvs[peer][r].push_back(i);
      }
    }
  }
  for (int a = 0; a < s.pp; ++a) {
    for (int b = 0; b < s.pp; ++b) {
      const std::size_t n = std::min(sends[a][b].size(), recvs[a][b].size());
      for (std::size_t k = 0; k < n; ++k) {
        const int i = sends[a][b][k], j = recvs[a][b][k];
        ranks[a].match[i] = Peer{b, ranks[b].batch_of[j], j};
        ranks[b].match[j] = Peer{a, ranks[a].batch_of[i], i};
      }
    }
  }
  // Each compute's receive: the first matching receive in its rank's list (validate() requires it
  // before the compute; if it is after, the compute waits for it all the same).
  for (int r = 0; r < s.pp; ++r) {
    RankState& st = ranks[r];
    const auto& list = s.actions[r];
    for (int c : st.computes) {
      int found = -1;
      bool missing = false;
      if (auto recv = detail::input_receive(s, list[c])) {
        auto it = std::find(list.begin(), list.end(), *recv);
        if (it == list.end()) {
          missing = true;
        } else {
          found = static_cast<int>(it - list.begin());
        }
      }
      st.input.push_back(found);
      st.input_missing.push_back(missing);
    }
  }
  return ranks;
}

// Why transfer op (action index i on rank r) cannot complete.
std::string transfer_wait(const Schedule& s, const std::vector<RankState>& ranks, int r, int i) {
  const Action& a = s.actions[r][i];
  const Peer& p = ranks[r].match[i];
  const int q = s.peer(a);
  const Action expected = detail::matching_transfer(a);
  if (p.rank < 0) {
    return is_send(a.kind)
               ? fmt::format("no receive on rank {} matches it: rank {} never posts {}", q, q,
                             expected.str())
               : fmt::format("the send {} never comes: rank {} never posts it", expected.str(), q);
  }
  return fmt::format("rank {} has not posted {} yet", q, s.actions[q][p.op].str());
}

std::string deadlock_line(const Schedule& s, const std::vector<RankState>& ranks, int r) {
  const RankState& st = ranks[r];
  const auto& list = s.actions[r];
  std::string comm, compute;
  if (st.next_batch < static_cast<int>(st.batches.size())) {
    const Batch& b = st.batches[st.next_batch];
    if (b.start != kUnknown) {
      for (int i : b.ops) {
        const Peer& p = st.match[i];
        if (p.rank < 0 || ranks[p.rank].batches[p.batch].start == kUnknown) {
          comm = fmt::format("{} ({})", list[i].str(), transfer_wait(s, ranks, r, i));
          break;
        }
      }
    }
  }
  if (st.next_compute < static_cast<int>(st.computes.size())) {
    const int n = st.next_compute;
    const Action& c = list[st.computes[n]];
    if (st.input_missing[n]) {
      compute = fmt::format("{} (its receive {} is not in the schedule)", c.str(),
                            detail::input_receive(s, c)->str());
    } else if (st.input[n] >= 0) {
      compute = fmt::format("{} for its receive {}", c.str(), list[st.input[n]].str());
    }
  }
  if (!comm.empty() && !compute.empty()) {
    return fmt::format("rank {} waits at {}; its compute waits at {}", r, comm, compute);
  }
  if (!comm.empty()) return fmt::format("rank {} waits at {}", r, comm);
  return fmt::format("rank {} waits at {}", r, compute);
}

// Max (stage, microbatch) pairs live at once: from the start of F to the end of B or W.
int peak_in_flight(const std::vector<TimedAction>& timeline) {
  std::vector<std::pair<double, int>> events;
  for (const TimedAction& t : timeline) {
    if (t.action.kind == ActionKind::forward) events.emplace_back(t.start, +1);
    if (t.action.kind == ActionKind::backward || t.action.kind == ActionKind::weight_grad) {
      events.emplace_back(t.end, -1);
    }
  }
  std::sort(events.begin(), events.end());  // at equal times the release (-1) comes first
  int live = 0, peak = 0;
  for (const auto& e : events) peak = std::max(peak, live += e.second);
  return peak;
}

// The simulation proper: compute_cost(r, i) is the duration of compute action i of rank r's
// list, transfer_latency(r, i) the latency of transfer i (a batch takes its slowest).
using CostOf = std::function<double(int rank, std::size_t index)>;
Simulation simulate_with(const Schedule& s, const CostOf& compute_cost,
                         const CostOf& transfer_latency);

}  // namespace

Simulation simulate(const Schedule& schedule, const ActionCosts& costs) {
  const std::vector<ActionCosts> per_stage(
      static_cast<std::size_t>(std::max(schedule.num_stages(), 1)), costs);
  return simulate(schedule, std::span<const ActionCosts>(per_stage));
}

Simulation simulate(const Schedule& schedule, std::span<const ActionCosts> stage_costs) {
  const Schedule& s = schedule;
  detail::validate_structure(s);
  QUINTET_CHECK(static_cast<int>(stage_costs.size()) == s.num_stages(),
                "simulate: {} stage costs for a schedule of {} stages; give one per stage",
                stage_costs.size(), s.num_stages());
  for (std::size_t k = 0; k < stage_costs.size(); ++k) {
    const ActionCosts& costs = stage_costs[k];
    QUINTET_CHECK(costs.forward >= 0 && costs.backward >= 0 && costs.p2p >= 0 &&
                      costs.weight_grad >= 0 && costs.weight_grad <= costs.backward,
                  "simulate: costs must be >= 0 with weight_grad <= backward (W is part of B), "
                  "found forward {}, backward {}, weight_grad {}, p2p {}{}",
                  costs.forward, costs.backward, costs.weight_grad, costs.p2p,
                  stage_costs.size() > 1 ? fmt::format(" for stage {}", k) : std::string());
  }
  return simulate_with(
      s,
      [&](int r, std::size_t i) {
        const Action& a = s.actions[r][i];
        return cost_of(a.kind, stage_costs[static_cast<std::size_t>(a.stage)]);
      },
      [&](int r, std::size_t i) {
        const Action& a = s.actions[r][i];  // a transfer takes its sender's latency
        const int sender = a.kind == ActionKind::recv_forward    ? a.stage - 1
                           : a.kind == ActionKind::recv_backward ? a.stage + 1
                                                                 : a.stage;
        return stage_costs[static_cast<std::size_t>(sender)].p2p;
      });
}

Simulation simulate(const Schedule& schedule,
                    const std::vector<std::vector<double>>& compute_durations, double p2p) {
  const Schedule& s = schedule;
  detail::validate_structure(s);
  QUINTET_CHECK(static_cast<int>(compute_durations.size()) == s.pp,
                "simulate: durations for {} ranks, the schedule has {}", compute_durations.size(),
                s.pp);
  QUINTET_CHECK(p2p >= 0, "simulate: p2p latency {} must be >= 0", p2p);
  std::vector<std::vector<double>> by_index(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    const auto& d = compute_durations[static_cast<std::size_t>(r)];
    std::size_t k = 0;
    for (const Action& a : list) {
      if (!is_compute(a.kind)) {
        by_index[r].push_back(0.0);
        continue;
      }
      QUINTET_CHECK(k < d.size() && d[k] >= 0,
                    "simulate: rank {} needs a duration >= 0 for each of its compute actions; "
                    "{} given, compute action {} ({}) has {}",
                    r, d.size(), k, a.str(), k < d.size() ? fmt::format("{}", d[k]) : "none");
      by_index[r].push_back(d[k++]);
    }
    QUINTET_CHECK(k == d.size(), "simulate: rank {} has {} compute actions but {} durations", r, k,
                  d.size());
  }
  return simulate_with(
      s, [&](int r, std::size_t i) { return by_index[r][i]; },
      [&](int, std::size_t) { return p2p; });
}

namespace {
Simulation simulate_with(const Schedule& s, const CostOf& compute_cost,
                         const CostOf& transfer_latency) {
  std::vector<RankState> ranks = build(s);

  // Resolve every time whose inputs are known until nothing moves. Each step is one event of the
  // executor: a compute starts, a batch starts, a batch completes.
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < s.pp; ++r) {
      RankState& st = ranks[r];
      // Computes, in order: after the previous compute and after the batch of their receive.
      while (st.next_compute < static_cast<int>(st.computes.size())) {
        const int n = st.next_compute;
        if (st.input_missing[n]) break;
        double ready = n > 0 ? st.end[st.computes[n - 1]] : 0.0;
        if (st.input[n] >= 0) {
          const Batch& b = st.batches[st.batch_of[st.input[n]]];
          if (b.end == kUnknown) break;
          ready = std::max(ready, b.end);
        }
        const int i = st.computes[n];
        st.start[i] = ready;
        st.end[i] = ready + compute_cost(r, static_cast<std::size_t>(i));
        ++st.next_compute;
        moved = true;
      }
      // Batches, one after another: start after the previous batch and the compute before them,
      // complete once every peer batch holding a match has started.
      while (st.next_batch < static_cast<int>(st.batches.size())) {
        Batch& b = st.batches[st.next_batch];
        if (b.start == kUnknown) {
          if (b.computes_before > st.next_compute) break;
          double ready = st.next_batch > 0 ? st.batches[st.next_batch - 1].end : 0.0;
          if (b.computes_before > 0) {
            ready = std::max(ready, st.end[st.computes[b.computes_before - 1]]);
          }
          b.start = ready;
          moved = true;
        }
        double done = b.start;
        bool complete = true;
        for (int i : b.ops) {
          const Peer& p = st.match[i];
          const double peer_start = p.rank < 0 ? kUnknown : ranks[p.rank].batches[p.batch].start;
          if (peer_start == kUnknown) {
            complete = false;
            break;
          }
          done = std::max(done, peer_start);
        }
        if (!complete) break;
        double latency = 0.0;  // the slowest of its transfers
        for (int i : b.ops) {
          latency = std::max(latency, transfer_latency(r, static_cast<std::size_t>(i)));
        }
        b.end = done + latency;
        for (int i : b.ops) {
          st.start[i] = b.start;
          st.end[i] = b.end;
        }
        ++st.next_batch;
        moved = true;
      }
    }
  }

  Simulation sim;
  sim.busy.assign(s.pp, 0.0);
  sim.peak_in_flight.assign(s.pp, 0);
  sim.timeline.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    const RankState& st = ranks[r];
    const bool stuck = st.next_compute < static_cast<int>(st.computes.size()) ||
                       st.next_batch < static_cast<int>(st.batches.size());
    if (stuck) {
      sim.deadlock = true;
      sim.deadlock_report += deadlock_line(s, ranks, r) + "\n";
    }
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      if (st.end[i] == kUnknown) continue;  // never ran (deadlock)
      const Action& a = s.actions[r][i];
      sim.timeline[r].push_back(TimedAction{a, st.start[i], st.end[i]});
      sim.makespan = std::max(sim.makespan, st.end[i]);
      if (is_compute(a.kind)) sim.busy[r] += st.end[i] - st.start[i];
    }
    sim.peak_in_flight[r] = peak_in_flight(sim.timeline[r]);
  }
  double total_busy = 0.0;
  for (double b : sim.busy) total_busy += b;
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - total_busy / (s.pp * sim.makespan) : 0.0;
  return sim;
}

}  // namespace

Simulation check_schedule(const Schedule& schedule, const ActionCosts& costs) {
  schedule.validate();
  Simulation sim = simulate(schedule, costs);
  QUINTET_CHECK(!sim.deadlock,
                "schedule '{}' (pp {}, vpp {}, microbatches {}) would deadlock:\n{}Reorder the "
                "transfers so that every batch's peers post their matches without waiting on it",
                schedule.name, schedule.pp, schedule.vpp, schedule.microbatches,
                sim.deadlock_report);
  return sim;
}

std::string chrome_trace(const Simulation& simulation) {
  const int pp = static_cast<int>(simulation.timeline.size());
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const std::string& event) {
    out += first ? "" : ",\n";
    out += event;
    first = false;
  };
  add(R"({"name":"process_name","ph":"M","pid":0,"args":{"name":"pipeline"}})");
  for (int r = 0; r < pp; ++r) {
    add(fmt::format(
        R"({{"name":"thread_name","ph":"M","pid":0,"tid":{},"args":{{"name":"rank {}"}}}})", r, r));
    add(fmt::format(
        R"({{"name":"thread_name","ph":"M","pid":0,"tid":{},"args":{{"name":"rank {} p2p"}}}})",
        pp + r, r));
  }
  for (int r = 0; r < pp; ++r) {
    std::string batch_name;
    auto flush_batch = [&](double start, double end) {
      if (batch_name.empty()) return;
      add(fmt::format(R"({{"name":"{}","cat":"p2p","ph":"X","pid":0,"tid":{},"ts":{},"dur":{}}})",
                      batch_name, pp + r, start * 1000.0, (end - start) * 1000.0));
      batch_name.clear();
    };
    double batch_start = 0, batch_end = 0;
    for (const TimedAction& t : simulation.timeline[r]) {
      if (is_compute(t.action.kind)) {
        flush_batch(batch_start, batch_end);
        add(fmt::format(
            R"({{"name":"{}","cat":"compute","ph":"X","pid":0,"tid":{},"ts":{},"dur":{}}})",
            t.action.str(), r, t.start * 1000.0, (t.end - t.start) * 1000.0));
        continue;
      }
      // One event per batch: consecutive transfers share their times.
      if (!batch_name.empty() && t.start == batch_start && t.end == batch_end) {
        batch_name += ' ';
        batch_name += t.action.str();
      } else {
        flush_batch(batch_start, batch_end);
        batch_name = t.action.str();
        batch_start = t.start;
        batch_end = t.end;
      }
    }
    flush_batch(batch_start, batch_end);
  }
  out += "\n]}\n";
  return out;
}

}  // namespace quintet::pipeline
