#include "metrics.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace gpt {

double flops_per_token(std::int64_t n, std::int64_t layers, std::int64_t hidden,
                       std::int64_t seq_len) {
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(layers) *
                                            static_cast<double>(hidden) *
                                            static_cast<double>(seq_len);
}

std::int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;
}

StepRecord step_record(std::int64_t step, const quintet::train::StepStats& r, double lr, double ms,
                       std::int64_t tokens_per_step, bool moe) {
  StepRecord rec;
  rec.step = step;
  rec.loss = r.loss;
  rec.lr = lr;
  rec.grad_norm = r.grad_norm();
  rec.ms = ms;
  rec.tokens_per_s = static_cast<double>(tokens_per_step) / (ms / 1000.0);
  rec.grad_mem_bytes = r.peak_gradient_bytes;
  rec.times = quintet::train::step_times(r);
  rec.comm_ms = r.dp.comm_ms;
  rec.tp_comm_ms = r.tp.exposed_ms;
  rec.tp_ops = r.tp.ops;
  rec.cp_comm_ms = r.cp.exposed_ms;
  rec.ep_comm_ms = r.ep.exposed_ms;
  rec.exposed_comm_pct =
      100.0 *
      (r.dp.exposed_ms + r.tp.exposed_ms + r.cp.exposed_ms + r.ep.exposed_ms + r.pp.exposed_ms) /
      ms;
  const auto kind = [](const quintet::train::AxisCommunication& a) {
    return kind_comm(a.comm_ms, a.exposed_ms);
  };
  rec.comm = {kind(r.dp), kind(r.tp), kind(r.pp), kind(r.ep), kind(r.cp)};  // kCommKinds' order
  if (moe) {
    rec.moe = MoeRecord{r.moe.min_load,         r.moe.mean_load, r.moe.max_load,
                        r.moe.dropped_fraction, r.moe.aux_loss,  r.moe.z_loss};
  }
  return rec;
}

KindComm kind_comm(double comm_ms, double exposed_ms) {
  KindComm k;
  k.comm_ms = std::max(0.0, comm_ms);
  k.exposed_ms = std::clamp(exposed_ms, 0.0, k.comm_ms);
  k.hidden_ms = k.comm_ms - k.exposed_ms;
  k.measured_exposed_ms = exposed_ms;
  return k;
}

Reporter::Reporter(bool active, bool json, bool progress, std::int64_t total_steps)
    : active_(active),
      json_(json),
      progress_(progress && active && !json && isatty(STDERR_FILENO)),
      total_(total_steps) {}

namespace {

std::string mem_str(std::int64_t bytes) {
  return bytes >= (1LL << 30) ? fmt::format("{:.2f} GiB", bytes / double(1LL << 30))
                              : fmt::format("{:.1f} MiB", bytes / double(1LL << 20));
}

nlohmann::json bound_json(const quintet::train::BoundBy& v) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : v.parts) {
    parts.push_back({{"name", p.name}, {"ms", p.ms}, {"pct", 100 * p.fraction}});
  }
  return {{"bound", v.bound().name}, {"step_ms", v.step_ms}, {"parts", parts}};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void Reporter::step(const StepRecord& r) {
  records_.push_back(r);
  if (!active_) return;
  if (json_) {
    nlohmann::json j{{"step", r.step},
                     {"loss", r.loss},
                     {"entropy_floor",
                      r.entropy_floor ? nlohmann::json(*r.entropy_floor) : nlohmann::json(nullptr)},
                     {"lr", r.lr},
                     {"grad_norm", r.grad_norm},
                     {"ms", r.ms},
                     {"tokens_per_s", r.tokens_per_s},
                     {"mfu", r.mfu ? nlohmann::json(*r.mfu) : nlohmann::json(nullptr)},
                     {"tflops", r.tflops ? nlohmann::json(*r.tflops) : nlohmann::json(nullptr)},
                     {"exposed_comm_pct", r.exposed_comm_pct},
                     {"comm_ms", r.comm_ms},
                     {"tp_comm_ms", r.tp_comm_ms},
                     {"tp_ops", r.tp_ops},
                     {"cp_comm_ms", r.cp_comm_ms},
                     {"ep_comm_ms", r.ep_comm_ms},
                     {"peak_mem_bytes", r.peak_mem_bytes},
                     {"grad_mem_bytes", r.grad_mem_bytes},
                     {"bound_by", bound_json(quintet::train::bound_by(r.times))}};
    for (std::size_t k = 0; k < kCommKinds.size(); ++k) {
      j["comm"][kCommKinds[k]] = {{"comm_ms", r.comm[k].comm_ms},
                                  {"exposed_ms", r.comm[k].exposed_ms},
                                  {"hidden_ms", r.comm[k].hidden_ms},
                                  {"measured_exposed_ms", r.comm[k].measured_exposed_ms}};
    }
    if (r.moe) {
      j["tokens_per_expert_min"] = r.moe->min_load;
      j["tokens_per_expert_mean"] = r.moe->mean_load;
      j["tokens_per_expert_max"] = r.moe->max_load;
      j["dropped_fraction"] = r.moe->dropped_fraction;
      j["aux_loss"] = r.moe->aux_loss;
      j["z_loss"] = r.moe->z_loss;
    }
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
    return;
  }
  if (progress_) std::fputs("\r\033[K", stderr);  // clear the bar before the line
  std::string line = fmt::format("step {:5d}/{} | loss {:.4f}", r.step, total_, r.loss);
  if (r.entropy_floor) line += fmt::format(" (floor {:.4f})", *r.entropy_floor);
  line += fmt::format(" | lr {:.2e} | grad norm {:.3f} | {:.1f} ms | {:.0f} tok/s", r.lr,
                      r.grad_norm, r.ms, r.tokens_per_s);
  if (r.mfu) line += fmt::format(" | MFU {:.1f}% ({:.1f} TFLOP/s)", 100 * *r.mfu, *r.tflops);
  std::string kinds;
  for (std::size_t k = 0; k < kCommKinds.size(); ++k) {
    if (r.comm[k].comm_ms <= 0.0) continue;
    kinds += fmt::format("{}{} {:.1f}/{:.1f}", kinds.empty() ? "" : ", ", kCommKinds[k],
                         r.comm[k].exposed_ms, r.comm[k].hidden_ms);
  }
  line += fmt::format(" | exposed comm {:.1f}%", r.exposed_comm_pct);
  if (!kinds.empty()) line += fmt::format(" (exposed/hidden ms: {})", kinds);
  line += fmt::format(" | peak mem {} (grads {})", mem_str(r.peak_mem_bytes),
                      mem_str(r.grad_mem_bytes));
  if (r.moe) {
    line += fmt::format(
        " | tokens/expert {:.0f}/{:.0f}/{:.0f} (min/mean/max), dropped {:.2f}%, aux {:.4f}, "
        "z {:.4f}",
        r.moe->min_load, r.moe->mean_load, r.moe->max_load, 100 * r.moe->dropped_fraction,
        r.moe->aux_loss, r.moe->z_loss);
  }
  fmt::print("{}\n", line);
  std::fflush(stdout);
  draw_progress(r);
}

void Reporter::saved(std::int64_t step, bool async, double ms, double waited_ms) const {
  if (!active_) return;
  if (json_) {
    fmt::print(
        "{}\n",
        nlohmann::json{
            {"saved_step", step}, {"async", async}, {"save_ms", ms}, {"waited_ms", waited_ms}}
            .dump());
  } else {
    fmt::print("saved step {} ({} {:.1f} ms{})\n", step,
               async ? "asynchronously: the snapshot took" : "in", ms,
               waited_ms >= 1.0
                   ? fmt::format(", after waiting {:.1f} ms for the previous save", waited_ms)
                   : std::string());
  }
  std::fflush(stdout);
}

void Reporter::validation(std::int64_t step, const quintet::train::Validation::Result& r) const {
  if (!active_) return;
  if (json_) {
    fmt::print(
        "{}\n",
        nlohmann::json{
            {"val_step", step}, {"val_loss", r.loss}, {"val_windows", r.windows}, {"val_ms", r.ms}}
            .dump());
  } else {
    if (progress_) std::fputs("\r\033[K", stderr);
    fmt::print("step {:5d}/{} | val_loss {:.4f} over {} windows | {:.1f} ms\n", step, total_,
               r.loss, r.windows, r.ms);
  }
  std::fflush(stdout);
}

void Reporter::checked_collectives(std::int64_t operations) const {
  if (!active_) return;
  if (json_) {
    fmt::print("{}\n", nlohmann::json{{"checked_operations", operations}}.dump());
  } else {
    fmt::print(
        "check-collectives: {} operations of rank 0 compared with the other ranks', all "
        "matched\n",
        operations);
  }
  std::fflush(stdout);
}

void Reporter::draw_progress(const StepRecord& r) const {
  if (!progress_) return;
  double spent_ms = 0;
  for (const auto& x : records_) spent_ms += x.ms;
  const double per_step = spent_ms / static_cast<double>(records_.size());
  const double eta_s = per_step * static_cast<double>(total_ - r.step) / 1000.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * r.step / std::max<std::int64_t>(total_, 1));
  fmt::print(stderr, "\r[{}{}] {}/{} ETA {:.0f} s", std::string(filled, '#'),
             std::string(kWidth - filled, '.'), r.step, total_, eta_s);
  if (r.step == total_) fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
}

void Reporter::summary(std::int64_t skip) const {
  if (!active_ || records_.empty()) return;
  std::size_t first = static_cast<std::size_t>(std::max<std::int64_t>(skip, 0));
  if (first >= records_.size()) first = 0;
  std::vector<double> ms, tps, mfu, exposed, comm, tp_comm, cp_comm, ep_comm;
  quintet::train::StepTimes times;  // summed: the verdict of the measured steps together
  for (std::size_t i = first; i < records_.size(); ++i) {
    times += records_[i].times;
    ms.push_back(records_[i].ms);
    tps.push_back(records_[i].tokens_per_s);
    if (records_[i].mfu) mfu.push_back(*records_[i].mfu);
    exposed.push_back(records_[i].exposed_comm_pct);
    comm.push_back(records_[i].comm_ms);
    tp_comm.push_back(records_[i].tp_comm_ms);
    cp_comm.push_back(records_[i].cp_comm_ms);
    ep_comm.push_back(records_[i].ep_comm_ms);
  }
  std::array<std::array<std::vector<double>, 3>, kCommKinds.size()> kind;  // comm, exposed, hidden
  for (std::size_t i = first; i < records_.size(); ++i) {
    for (std::size_t k = 0; k < kCommKinds.size(); ++k) {
      kind[k][0].push_back(records_[i].comm[k].comm_ms);
      kind[k][1].push_back(records_[i].comm[k].exposed_ms);
      kind[k][2].push_back(records_[i].comm[k].hidden_ms);
    }
  }
  const StepRecord& last = records_.back();
  // Peak memory two ways, as the PyTorch peers report it too: the steady state (the most any
  // measured step reached; the peak is reset at each step's start) and the whole run (start-up,
  // warm-up and skipped steps included).
  std::int64_t steady_peak = 0, run_peak = start_peak_;
  for (std::size_t i = 0; i < records_.size(); ++i) {
    if (i >= first) steady_peak = std::max(steady_peak, records_[i].peak_mem_bytes);
    run_peak = std::max(run_peak, records_[i].peak_mem_bytes);
  }
  const std::int64_t measured = static_cast<std::int64_t>(records_.size() - first);
  if (json_) {
    nlohmann::json j{
        {"summary", true},
        {"steps_measured", measured},
        {"final_loss", last.loss},
        {"median_ms", median(ms)},
        {"median_tokens_per_s", median(tps)},
        {"median_mfu", mfu.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(mfu))},
        {"median_exposed_comm_pct", median(exposed)},
        {"median_comm_ms", median(comm)},
        {"median_tp_comm_ms", median(tp_comm)},
        {"median_cp_comm_ms", median(cp_comm)},
        {"median_ep_comm_ms", median(ep_comm)},
        {"peak_mem_bytes", steady_peak},
        {"run_peak_mem_bytes", run_peak},
        {"params", params_},
        {"non_embedding_params", non_embedding_params_},
        {"grad_mem_bytes", last.grad_mem_bytes},
        {"bound_by", bound_json(quintet::train::bound_by(times))}};
    for (std::size_t k = 0; k < kCommKinds.size(); ++k) {
      j["median_comm"][kCommKinds[k]] = {{"comm_ms", median(kind[k][0])},
                                         {"exposed_ms", median(kind[k][1])},
                                         {"hidden_ms", median(kind[k][2])}};
    }
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("summary: {} steps measured (first {} skipped) | final loss {:.4f}", measured, first,
             last.loss);
  if (last.entropy_floor) fmt::print(" (floor {:.4f})", *last.entropy_floor);
  fmt::print(" | median {:.1f} ms/step, {:.0f} tok/s", median(ms), median(tps));
  if (!mfu.empty()) fmt::print(", MFU {:.1f}%", 100 * median(mfu));
  fmt::print(
      " | dp comm {:.2f} ms, exposed tp comm {:.2f} ms, exposed {:.1f}% | peak mem {} (whole "
      "run {}, grads {})\n",
      median(comm), median(tp_comm), median(exposed), mem_str(steady_peak), mem_str(run_peak),
      mem_str(last.grad_mem_bytes));
  fmt::print("communication per step (median ms)   in flight    exposed     hidden\n");
  for (std::size_t k = 0; k < kCommKinds.size(); ++k) {
    fmt::print("  {:<34} {:>10.2f} {:>10.2f} {:>10.2f}\n", kCommKinds[k], median(kind[k][0]),
               median(kind[k][1]), median(kind[k][2]));
  }
  fmt::print("{}\n", quintet::train::bound_by(times).str(measured));
}

}  // namespace gpt
