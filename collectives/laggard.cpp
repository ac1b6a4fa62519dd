#include "collectives/laggard.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <set>
#include <sstream>

#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

std::string clean(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == ',') c = '_';
  }
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

template <class T>
bool parse_number(const std::string& s, T* out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool is_point_to_point(std::string_view op) { return op == "send" || op == "recv" || op == "p2p"; }

std::string ranks_phrase(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", rank_list(ranks));
}

// What a rank that answered waits for, on whichever of its communicators has waited longest.
std::string waits_for(const std::vector<CommProgress>& report) {
  const CommProgress* oldest = nullptr;
  for (const CommProgress& c : report) {
    if (!c.pending_op.empty() && (oldest == nullptr || c.pending_s > oldest->pending_s)) {
      oldest = &c;
    }
  }
  if (oldest == nullptr) return "it waits for no operation";
  return fmt::format("it waits for {} #{} on '{}' ({:.0f} s)", oldest->pending_op,
                     oldest->pending_seq, oldest->name, oldest->pending_s);
}

}  // namespace

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string progress_report(const FlightRegistry& registry) {
  std::string out;
  const std::int64_t now = steady_now_ns();
  for (const auto& rec : registry.recorders()) {
    if (rec->retired()) continue;  // its communicator is gone
    const FlightProgress p = rec->progress();
    std::string ranks;
    for (int r : rec->world_ranks()) {
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    std::string pending_op;
    std::int64_t pending_seq = -1;
    double pending_s = 0;
    if (p.completed < p.enqueued) {
      pending_seq = p.completed + 1;
      FlightOp op;
      pending_op = rec->find(pending_seq, &op) ? std::string(op.op) : "operation";
      if (op.seq == pending_seq) pending_s = static_cast<double>(now - op.enqueued_ns) * 1e-9;
    }
    out += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.3f}\n", clean(rec->name()), ranks,
                       p.enqueued, p.started, p.completed, pending_op, pending_seq, pending_s);
  }
  return out;
}

std::vector<CommProgress> parse_progress_report(const std::string& report) {
  std::vector<CommProgress> comms;
  for (const std::string& line : split(report, '\n')) {
    const std::vector<std::string> f = split(line, '\t');
    if (f.size() != 8) continue;
    CommProgress c;
    c.name = f[0];
    bool ok = true;
    for (const std::string& r : split(f[1], ',')) {
      int w = 0;
      ok = ok && parse_number(r, &w);
      c.world_ranks.push_back(w);
    }
    ok = ok && parse_number(f[2], &c.progress.enqueued) &&
         parse_number(f[3], &c.progress.started) && parse_number(f[4], &c.progress.completed) &&
         parse_number(f[6], &c.pending_seq);
    c.pending_op = f[5];
    c.pending_s = std::atof(f[7].c_str());
    if (ok) comms.push_back(std::move(c));
  }
  return comms;
}

StuckOp stuck_op(const FlightRecorder& rec, int world_rank, std::string_view waited_op,
                 std::int64_t waited_seq, int waited_peer) {
  StuckOp stuck;
  stuck.comm = rec.name();
  stuck.members = rec.world_ranks();
  stuck.world_rank = world_rank;
  stuck.seq = rec.progress().completed + 1;
  stuck.op = std::string(waited_op);
  stuck.peer = waited_peer;
  if (stuck.seq != waited_seq) {
    FlightOp f;
    const bool held = rec.find(stuck.seq, &f);
    stuck.op = held ? std::string(f.op) : "operation";
    stuck.peer = held ? f.peer : -1;
  }
  return stuck;
}

LaggardVerdict find_laggards(const StuckOp& stuck,
                             const std::map<int, std::vector<CommProgress>>& reports,
                             int world_size) {
  const std::vector<int>& members = stuck.members;
  const bool p2p = is_point_to_point(stuck.op);
  std::vector<int> candidates;  // the members this rank waits for
  if (p2p && stuck.peer >= 0 && stuck.peer < static_cast<int>(members.size())) {
    candidates.push_back(members[static_cast<std::size_t>(stuck.peer)]);
  } else {
    for (int m : members) {
      if (m != stuck.world_rank) candidates.push_back(m);
    }
  }
  LaggardVerdict verdict;
  verdict.waiting.push_back(stuck.world_rank);
  for (int c : candidates) {
    const auto answer = reports.find(c);
    if (answer == reports.end()) {
      Laggard silent;
      silent.rank = c;
      silent.why = Laggard::Why::silent;
      verdict.behind.push_back(std::move(silent));
      continue;
    }
    const std::vector<CommProgress>& report = answer->second;
    const auto mine = std::find_if(report.begin(), report.end(), [&](const CommProgress& p) {
      return p.name == stuck.comm && p.world_ranks == members;
    });
    Laggard l;
    l.rank = c;
    l.why = Laggard::Why::never_reached;
    l.elsewhere = waits_for(report);
    if (mine == report.end()) {
      l.why = Laggard::Why::no_communicator;
    } else if (p2p) {
      if (!mine->pending_op.empty()) {
        verdict.waiting.push_back(c);
        continue;
      }
      l.why = Laggard::Why::idle_peer;
      l.completed = mine->progress.completed;
    } else if (mine->progress.enqueued < stuck.seq) {
      l.issued = mine->progress.enqueued;
    } else {
      if (mine->progress.completed < stuck.seq) verdict.waiting.push_back(c);
      continue;
    }
    verdict.behind.push_back(std::move(l));
  }
  // Ranks outside this group that are stopped or dead (what the group waits for may wait on them).
  const std::set<int> asked(candidates.begin(), candidates.end());
  for (int r = 0; r < world_size; ++r) {
    if (r != stuck.world_rank && !asked.contains(r) && !reports.contains(r)) {
      verdict.silent.push_back(r);
    }
  }
  return verdict;
}

std::string describe_laggards(const StuckOp& stuck, const LaggardVerdict& verdict,
                              double waited_s) {
  if (verdict.behind.empty()) return {};
  const std::string what = fmt::format("{} #{} on '{}'", stuck.op, stuck.seq, stuck.comm);
  std::string out;
  for (const Laggard& l : verdict.behind) {
    if (!out.empty()) out += "; ";
    switch (l.why) {
      case Laggard::Why::silent:
        out +=
            fmt::format("rank {} has not completed {} and does not answer: it is stopped or dead",
                        l.rank, what);
        break;
      case Laggard::Why::no_communicator:
        out += fmt::format("rank {} has no communicator '{}' of these ranks ({})", l.rank,
                           stuck.comm, l.elsewhere);
        break;
      case Laggard::Why::idle_peer:
        out += fmt::format(
            "rank {}, the peer of {}, has no operation pending there (it has completed up to #{}; "
            "{})",
            l.rank, what, l.completed, l.elsewhere);
        break;
      case Laggard::Why::never_reached:
        out += fmt::format("rank {} never reached {} (it has issued up to #{} there; {})", l.rank,
                           what, l.issued, l.elsewhere);
        break;
    }
  }
  out += fmt::format(" ({} waited {:g} s)", ranks_phrase(verdict.waiting), waited_s);
  if (!verdict.silent.empty()) {
    out += fmt::format("; {} of the job {} not answer (stopped or dead)",
                       ranks_phrase(verdict.silent), verdict.silent.size() == 1 ? "does" : "do");
  }
  return out;
}

std::string name_laggards(const FlightRecorder& rec, std::string_view waited_op,
                          std::int64_t waited_seq, int waited_peer, const ProgressChannel& channel,
                          double waited_s) noexcept {
  if (!channel.query) return {};
  try {
    const StuckOp stuck = stuck_op(rec, channel.world_rank, waited_op, waited_seq, waited_peer);
    std::map<int, std::vector<CommProgress>> reports;
    for (const auto& [rank, report] : channel.query(kLaggardAnswerWait)) {
      reports[rank] = parse_progress_report(report);
    }
    return describe_laggards(stuck, find_laggards(stuck, reports, channel.world_size), waited_s);
  } catch (const std::exception& e) {
    log::warn("could not name the rank that is behind: {}", e.what());
  } catch (...) {
  }
  return {};
}

}  // namespace quintet::detail
