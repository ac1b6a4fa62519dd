// The schedule generators. Each makes the compute order of every rank (from the schedule's own
// rule, or a greedy list schedule for the zero-bubble ones), then place_transfers() writes the
// sends and receives from a planned timeline of that order, so that in the batched execution of
// schedule.hpp each receive is posted when its sender sends and no batch waits on a later one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "quintet/core/error.hpp"
#include "quintet/parallel/pipeline/schedule.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"
#include "schedule_internal.hpp"

namespace quintet::pipeline {

namespace {

// A compute's duration in the plan. Plans keep every compute longer than zero, so that the order
// of a planned timeline is the order of the lists (a zero-cost W would tie with its neighbours).
double plan_cost(ActionKind kind, const ActionCosts& c) {
  const double floor = 1e-3 * std::max({c.forward, c.backward, 1e-9});
  const double cost = kind == ActionKind::forward      ? c.forward
                      : kind == ActionKind::backward   ? c.backward
                      : kind == ActionKind::input_grad ? c.backward - c.weight_grad
                                                       : c.weight_grad;
  return std::max(cost, floor);
}

Action compute(ActionKind kind, int stage, int microbatch) { return {kind, stage, microbatch}; }

Schedule empty_schedule(ScheduleKind kind, int pp, int vpp, int microbatches,
                        std::vector<int> stage_rank) {
  Schedule s;
  s.name = std::string(schedule_kind_name(kind));
  s.pp = pp;
  s.vpp = vpp;
  s.microbatches = microbatches;
  s.stage_rank = std::move(stage_rank);
  s.actions.resize(pp);
  return s;
}

std::vector<int> looped_placement(int pp, int vpp) {  // stage s on rank s % pp
  std::vector<int> out(pp * vpp);
  for (int s = 0; s < pp * vpp; ++s) out[s] = s % pp;
  return out;
}

std::vector<int> v_placement(int pp) {  // rank r holds stages r and 2pp - 1 - r
  std::vector<int> out(2 * pp);
  for (int r = 0; r < pp; ++r) out[r] = out[2 * pp - 1 - r] = r;
  return out;
}

// ---- compute orders ----

void gpipe_order(Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    for (int m = 0; m < s.microbatches; ++m) {
      s.actions[r].push_back(compute(ActionKind::forward, r, m));
    }
    for (int m = 0; m < s.microbatches; ++m) {
      s.actions[r].push_back(compute(ActionKind::backward, r, m));
    }
  }
}

void one_f_one_b_order(Schedule& s) {
  const int m = s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    auto& list = s.actions[r];
    const int warmup = std::min(s.pp - r - 1, m);
    for (int i = 0; i < warmup; ++i) list.push_back(compute(ActionKind::forward, r, i));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(compute(ActionKind::forward, r, warmup + i));
      list.push_back(compute(ActionKind::backward, r, i));
    }
    for (int i = m - warmup; i < m; ++i) list.push_back(compute(ActionKind::backward, r, i));
  }
}

// ZB-H1 (Qi et al. 2023): 1F1B with B split into I and W. Rank r warms up with pp - r - 1
// forwards like 1F1B, then runs F, I pairs; its W's are deferred by r pairs (W(i - r) after the
// i-th pair), so every rank holds at most pp microbatches, 1F1B's peak on rank 0; the cool-down
// alternates the remaining I's with the W's. The later ranks idle the most in 1F1B's cool-down,
// so they defer the most W into it.
void zb_h1_order(Schedule& s) {
  const int m = s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    auto& list = s.actions[r];
    const int warmup = std::min(s.pp - r - 1, m);
    int next_w = 0;
    for (int i = 0; i < warmup; ++i) list.push_back(compute(ActionKind::forward, r, i));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(compute(ActionKind::forward, r, warmup + i));
      list.push_back(compute(ActionKind::input_grad, r, i));
      if (i >= r) list.push_back(compute(ActionKind::weight_grad, r, next_w++));
    }
    for (int i = m - warmup; i < m; ++i) {
      list.push_back(compute(ActionKind::input_grad, r, i));
      list.push_back(compute(ActionKind::weight_grad, r, next_w++));
    }
    while (next_w < m) list.push_back(compute(ActionKind::weight_grad, r, next_w++));
  }
}

// Megatron-Core's interleaved order: virtual microbatch k of a rank is (microbatch, chunk) from a
// table that walks groups of pp microbatches through every chunk in turn; backward walks the same
// table with the chunks reversed. Warm-up of 2 (pp - rank - 1) + (vpp - 1) pp forwards, then one
// forward one backward, then the remaining backwards.
void interleaved_order(Schedule& s) {
  const int pp = s.pp, vpp = s.vpp, m = s.microbatches, group = pp;
  std::vector<std::pair<int, int>> table;  // (microbatch, chunk)
  for (int first = 0; first < m; first += group) {
    const int last = std::min(first + group, m);
    for (int c = 0; c < vpp; ++c) {
      for (int mb = first; mb < last; ++mb) table.emplace_back(mb, c);
    }
  }
  const int total = m * vpp;
  for (int r = 0; r < pp; ++r) {
    auto& list = s.actions[r];
    auto fwd = [&](int k) {
      list.push_back(compute(ActionKind::forward, table[k].second * pp + r, table[k].first));
    };
    auto bwd = [&](int k) {
      list.push_back(
          compute(ActionKind::backward, (vpp - 1 - table[k].second) * pp + r, table[k].first));
    };
    const int warmup = std::min(2 * (pp - r - 1) + (vpp - 1) * group, total);
    for (int k = 0; k < warmup; ++k) fwd(k);
    for (int k = 0; k < total - warmup; ++k) {
      fwd(warmup + k);
      bwd(k);
    }
    for (int k = total - warmup; k < total; ++k) bwd(k);
  }
}

// A greedy list schedule of F, I and W at the plan costs (transfers free): whenever a rank is free
// it runs the first ready action of I (the oldest microbatch; on a V the lower stage), then F
// (oldest microbatch, then the higher stage; only while fewer than cap[rank] (stage, microbatch)
// pairs are in flight, F to W), then W (oldest first). Deterministic: ranks and actions are
// scanned in a fixed order and time only moves to the next end of an action.
void greedy_split_order(Schedule& s, const std::vector<int>& cap, const ActionCosts& costs) {
  const int S = s.num_stages(), M = s.microbatches;
  auto idx = [M](int stage, int mb) { return stage * M + mb; };
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<double> f_end(S * M, kNever), i_end(S * M, kNever);
  std::vector<double> busy_until(s.pp, 0.0);
  std::vector<int> in_flight(s.pp, 0);
  std::vector<std::vector<std::pair<int, int>>> pending_w(s.pp);  // (mb, stage) with I done
  std::vector<std::vector<int>> stages(s.pp);
  for (int r = 0; r < s.pp; ++r) stages[r] = s.stages_of(r);
  std::vector<int> next_f(S, 0), next_i(S, 0);  // each stage runs its microbatches in order

  // The action rank r would run at time t; F only under the cap unless over_cap.
  auto pick = [&](int r, double t, bool over_cap) -> std::optional<Action> {
    int best = -1;  // I: oldest microbatch, then the lower stage
    for (int st : stages[r]) {
      const int mb = next_i[st];
      if (mb >= M || f_end[idx(st, mb)] > t) continue;
      const bool ready = st == S - 1 || i_end[idx(st + 1, mb)] <= t;
      if (ready && (best < 0 || mb < next_i[best])) best = st;
    }
    if (best >= 0) return compute(ActionKind::input_grad, best, next_i[best]);
    std::optional<Action> f;  // F: oldest microbatch, then the higher stage
    if (in_flight[r] < cap[static_cast<std::size_t>(r)] || over_cap) {
      for (auto it = stages[r].rbegin(); it != stages[r].rend(); ++it) {
        const int st = *it, mb = next_f[st];
        if (mb >= M || (st > 0 && f_end[idx(st - 1, mb)] > t)) continue;
        if (!f || mb < f->microbatch) f = compute(ActionKind::forward, st, mb);
      }
    }
    if (f || over_cap || pending_w[r].empty()) return f;
    auto oldest = std::min_element(pending_w[r].begin(), pending_w[r].end());
    return compute(ActionKind::weight_grad, oldest->second, oldest->first);
  };
  auto run = [&](int r, double t, const Action& a) {
    s.actions[r].push_back(a);
    const double end = t + plan_cost(a.kind, costs);
    busy_until[r] = end;
    if (a.kind == ActionKind::forward) {
      f_end[idx(a.stage, a.microbatch)] = end;
      ++next_f[a.stage];
      ++in_flight[r];
    } else if (a.kind == ActionKind::input_grad) {
      i_end[idx(a.stage, a.microbatch)] = end;
      ++next_i[a.stage];
      pending_w[r].emplace_back(a.microbatch, a.stage);
    } else {
      pending_w[r].erase(
          std::find(pending_w[r].begin(), pending_w[r].end(), std::pair(a.microbatch, a.stage)));
      --in_flight[r];  // this rank is busy until the W ends, so nothing reuses the slot early
    }
  };
  const std::size_t total = 3 * static_cast<std::size_t>(S) * M;
  std::size_t done = 0;
  double t = 0.0;
  while (done < total) {
    for (int r = 0; r < s.pp; ++r) {
      while (busy_until[r] <= t) {
        auto a = pick(r, t, false);
        if (!a) break;
        run(r, t, *a);
        ++done;
      }
    }
    double next = kNever;
    for (int r = 0; r < s.pp; ++r) {
      if (busy_until[r] > t) next = std::min(next, busy_until[r]);
    }
    if (next < kNever) {
      t = next;
      continue;
    }
    if (done == total) break;
    // Every rank idle with work left: the cap holds everyone back; let the first ready F past it.
    bool moved = false;
    for (int r = 0; r < s.pp && !moved; ++r) {
      if (auto a = pick(r, t, true)) {
        run(r, t, *a);
        ++done;
        moved = true;
      }
    }
    QUINTET_CHECK(moved,
                  "greedy schedule for pp {}, vpp {}, microbatches {} stalled at time {} "
                  "(a bug in the generator)",
                  s.pp, s.vpp, M, t);
  }
}

// ---- transfers ----

// Dataflow start and end of every compute of the order at plan costs, transfers free.
struct Plan {
  std::vector<std::vector<double>> end;  // [rank][compute index in the list]
  std::vector<double> producer_end;      // [kind][stage][mb] for F and B/I: when its output exists
};

Plan plan(const Schedule& s, const ActionCosts& costs) {
  const int S = s.num_stages(), M = s.microbatches;
  auto key = [S, M](bool backward, int stage, int mb) { return (backward * S + stage) * M + mb; };
  const double kUnset = -1.0;
  Plan p;
  p.end.resize(s.pp);
  p.producer_end.assign(2 * S * M, kUnset);
  std::vector<std::size_t> next(s.pp, 0);
  std::vector<double> free_at(s.pp, 0.0);
  for (int r = 0; r < s.pp; ++r) p.end[r].assign(s.actions[r].size(), kUnset);
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < s.pp; ++r) {
      for (; next[r] < s.actions[r].size(); ++next[r]) {
        const Action& a = s.actions[r][next[r]];
        double ready = free_at[r];
        if (a.kind == ActionKind::forward && a.stage > 0) {
          const double in = p.producer_end[key(false, a.stage - 1, a.microbatch)];
          if (in == kUnset) break;
          ready = std::max(ready, in);
        }
        if ((a.kind == ActionKind::backward || a.kind == ActionKind::input_grad) &&
            a.stage < S - 1) {
          const double in = p.producer_end[key(true, a.stage + 1, a.microbatch)];
          if (in == kUnset) break;
          ready = std::max(ready, in);
        }
        free_at[r] = p.end[r][next[r]] = ready + plan_cost(a.kind, costs);
        if (a.kind != ActionKind::weight_grad) {
          p.producer_end[key(a.kind != ActionKind::forward, a.stage, a.microbatch)] = free_at[r];
        }
        moved = true;
      }
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    QUINTET_CHECK(next[r] == s.actions[r].size(),
                  "{} for pp {}, vpp {}, microbatches {}: the compute order of rank {} waits "
                  "forever at {} (a bug in the generator)",
                  s.name, s.pp, s.vpp, s.microbatches, r, s.actions[r][next[r]].str());
  }
  return p;
}

// Rewrites each rank's compute-only list with its transfers: every send right after the compute
// whose output it carries; every receive after the last compute that, in the planned timeline,
// ends no later than its sender's compute, i.e. posted when the message is sent. A receive posted
// there completes as soon as its send is posted, so it never holds up the sends queued behind it,
// and it is early: the compute that precedes its consumer overlaps it.
void place_transfers(Schedule& s, const ActionCosts& costs) {
  const int S = s.num_stages(), M = s.microbatches;
  const Plan p = plan(s, costs);
  auto key = [S, M](bool backward, int stage, int mb) { return (backward * S + stage) * M + mb; };
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<Action> computes = std::move(s.actions[r]);
    const std::vector<double>& end = p.end[r];
    // slot k holds the transfers posted after compute k - 1 (before compute k).
    std::vector<std::vector<Action>> sends(computes.size() + 1);
    std::vector<std::vector<std::pair<double, Action>>> recvs(computes.size() + 1);
    for (std::size_t k = 0; k < computes.size(); ++k) {
      const Action& c = computes[k];
      if (auto send = detail::output_send(s, c)) sends[k + 1].push_back(*send);
      if (auto recv = detail::input_receive(s, c)) {
        const bool backward = c.kind != ActionKind::forward;
        const double sent =
            p.producer_end[key(backward, c.stage + (backward ? 1 : -1), c.microbatch)];
        // Times that are equal at exact costs may differ in their last bits (sums of costs like
        // 0.1 in another order): a compute ending within that of the send counts as no later.
        const double tie = 1e-9 * (1.0 + std::abs(sent));
        const std::size_t slot = static_cast<std::size_t>(
            std::upper_bound(end.begin(), end.begin() + k, sent + tie) - end.begin());
        recvs[slot].emplace_back(sent, *recv);
      }
    }
    auto& list = s.actions[r];
    for (std::size_t k = 0; k <= computes.size(); ++k) {
      for (const Action& a : sends[k]) list.push_back(a);
      std::stable_sort(recvs[k].begin(), recvs[k].end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [t, a] : recvs[k]) list.push_back(a);
      if (k < computes.size()) list.push_back(computes[k]);
    }
  }
}

void require(bool ok, ScheduleKind kind, int pp, int vpp, int m, const std::string& rule) {
  QUINTET_CHECK(ok, "make_schedule({}, pp {}, vpp {}, microbatches {}): {}",
                schedule_kind_name(kind), pp, vpp, m, rule);
}

// The simulated run of a compute order once its transfers are placed (on a copy).
Simulation planned(Schedule order, const ActionCosts& costs) {
  place_transfers(order, costs);
  return simulate(order, costs);
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int pp, int vpp, int microbatches,
                       const ActionCosts& costs) {
  const int m = microbatches;
  require(pp >= 1 && vpp >= 1 && m >= 1, kind, pp, vpp, m,
          "expected pp, vpp and microbatches >= 1");
  const std::string name(schedule_kind_name(kind));
  require(costs.forward >= 0 && costs.weight_grad >= 0 && costs.weight_grad <= costs.backward &&
              costs.p2p >= 0,
          kind, pp, vpp, m,
          fmt::format("costs must be >= 0 with weight_grad <= backward, found forward {}, "
                      "backward {}, weight_grad {}, p2p {}",
                      costs.forward, costs.backward, costs.weight_grad, costs.p2p));
  Schedule s;
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1:
      require(vpp == 1, kind, pp, vpp, m,
              fmt::format("{} takes vpp = 1 (one stage per rank), found vpp {}; for vpp >= 2 "
                          "use interleaved (or zb-v with vpp = 2)",
                          name, vpp));
      s = empty_schedule(kind, pp, 1, m, looped_placement(pp, 1));
      if (kind == ScheduleKind::gpipe) gpipe_order(s);
      if (kind == ScheduleKind::one_f_one_b) one_f_one_b_order(s);
      if (kind == ScheduleKind::zb_h1) {
        require(m >= pp, kind, pp, vpp, m,
                fmt::format("zb-h1 needs microbatches >= pp (a full 1F1B steady state to defer "
                            "W into), found {} < {}; use 1f1b, or at least {} microbatches",
                            m, pp, pp));
        // Orders with 1F1B's peak memory (at most pp microbatches in flight on any rank, as on
        // 1F1B's first): the fixed pattern, best when F, I and W take about as long, and greedy
        // list schedules at the plan costs under two caps (1F1B's own per-rank counts pp - r, and
        // pp everywhere), which adapt to other costs; the one that finishes first at those costs.
        const Schedule blank = s;
        zb_h1_order(s);
        double best = planned(s, costs).makespan;
        std::vector<int> tight;
        for (int r = 0; r < pp; ++r) tight.push_back(pp - r);
        for (const std::vector<int>& cap :
             {tight, std::vector<int>(static_cast<std::size_t>(pp), pp)}) {
          Schedule greedy = blank;
          greedy_split_order(greedy, cap, costs);
          const Simulation g = planned(greedy, costs);
          bool within = !g.deadlock;
          for (int r = 0; r < pp; ++r) within = within && g.peak_in_flight[r] <= pp;
          if (within && g.makespan < best) {
            best = g.makespan;
            s = std::move(greedy);
          }
        }
      }
      break;
    case ScheduleKind::interleaved:
      require(vpp >= 2, kind, pp, vpp, m,
              fmt::format("interleaved takes vpp >= 2 stages per rank, found vpp {}; for one "
                          "stage per rank use 1f1b",
                          vpp));
      require(m % pp == 0, kind, pp, vpp, m,
              fmt::format("interleaved 1F1B runs the microbatches through each model chunk in "
                          "groups of pp = {} (Megatron-Core's microbatch-group rule, "
                          "microbatch_group_size_per_vp_stage = pp), so microbatches must be a "
                          "multiple of pp, found {}; use {} or {}",
                          pp, m, std::max(pp, m / pp * pp), (m / pp + 1) * pp));
      s = empty_schedule(kind, pp, vpp, m, looped_placement(pp, vpp));
      interleaved_order(s);
      break;
    case ScheduleKind::zb_v:
      require(vpp == 2, kind, pp, vpp, m,
              fmt::format("zb-v takes vpp = 2 (two stages per rank in a V), found vpp {}", vpp));
      require(m >= pp, kind, pp, vpp, m,
              fmt::format("zb-v needs microbatches >= pp (to fill the V's steady state), found "
                          "{} < {}; use at least {} microbatches",
                          m, pp, pp));
      s = empty_schedule(kind, pp, 2, m, v_placement(pp));
      // 1F1B's peak memory: 2 pp half-size stages in flight on every rank.
      greedy_split_order(s, std::vector<int>(static_cast<std::size_t>(pp), 2 * pp), costs);
      break;
  }
  place_transfers(s, costs);
  s.validate();
  const Simulation sim = simulate(s, costs);
  QUINTET_CHECK(!sim.deadlock,
                "{} for pp {}, vpp {}, microbatches {} deadlocks (a bug in the "
                "generator):\n{}",
                name, pp, vpp, m, sim.deadlock_report);
  return s;
}

}  // namespace quintet::pipeline
