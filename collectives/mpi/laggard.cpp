#include "collectives/mpi/laggard.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

#include "collectives/mpi/job_monitor.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

namespace {

// How long a rank whose wait timed out waits for the others' reports: their monitors answer within
// a poll (20 ms) unless they are stopped or dead, and those never do.
constexpr std::chrono::milliseconds kAnswerWait{2000};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
  const std::int64_t now = now_ns();
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

std::string describe_laggards(const FlightRecorder& rec, int world_rank, const OpInfo& waited,
                              const std::map<int, std::string>& answers, int world_size,
                              double waited_s) {
  const std::vector<int>& members = rec.world_ranks();
  const std::int64_t seq = rec.progress().completed + 1;  // what this rank is stuck on
  std::string op = waited.op;
  int peer = waited.peer;
  if (seq != waited.seq) {
    FlightOp f;
    op = rec.find(seq, &f) ? std::string(f.op) : "operation";
    peer = rec.find(seq, &f) ? f.peer : -1;
  }
  const bool p2p = is_point_to_point(op);
  std::vector<int> candidates;
  if (p2p && peer >= 0 && peer < static_cast<int>(members.size())) {
    candidates.push_back(members[static_cast<std::size_t>(peer)]);
  } else {
    for (int m : members) {
      if (m != world_rank) candidates.push_back(m);
    }
  }
  const std::string what = fmt::format("{} #{} on '{}'", op, seq, rec.name());
  std::vector<std::string> behind;
  std::vector<int> waiting{world_rank};
  for (int c : candidates) {
    const auto answer = answers.find(c);
    if (answer == answers.end()) {
      behind.push_back(fmt::format(
          "rank {} has not completed {} and does not answer: it is stopped or dead", c, what));
      continue;
    }
    const std::vector<CommProgress> report = parse_progress_report(answer->second);
    const auto mine = std::find_if(report.begin(), report.end(), [&](const CommProgress& p) {
      return p.name == rec.name() && p.world_ranks == members;
    });
    if (mine == report.end()) {
      behind.push_back(fmt::format("rank {} has no communicator '{}' of these ranks ({})", c,
                                   rec.name(), waits_for(report)));
    } else if (p2p) {
      if (mine->pending_op.empty()) {
        behind.push_back(fmt::format(
            "rank {}, the peer of {}, has no operation pending there (it has completed up to #{}; "
            "{})",
            c, what, mine->progress.completed, waits_for(report)));
      } else {
        waiting.push_back(c);
      }
    } else if (mine->progress.enqueued < seq) {
      behind.push_back(fmt::format("rank {} never reached {} (it has issued up to #{} there; {})",
                                   c, what, mine->progress.enqueued, waits_for(report)));
    } else if (mine->progress.completed < seq) {
      waiting.push_back(c);
    }
  }
  if (behind.empty()) return {};
  std::string out;
  for (const std::string& b : behind) {
    if (!out.empty()) out += "; ";
    out += b;
  }
  out += fmt::format(" ({} waited {:g} s)", ranks_phrase(waiting), waited_s);
  // Ranks outside this group that are stopped or dead (what the group waits for may wait on them).
  std::vector<int> silent;
  const std::set<int> asked(candidates.begin(), candidates.end());
  for (int r = 0; r < world_size; ++r) {
    if (r != world_rank && !asked.contains(r) && !answers.contains(r)) silent.push_back(r);
  }
  if (!silent.empty()) {
    out += fmt::format("; {} of the job {} not answer (stopped or dead)", ranks_phrase(silent),
                       silent.size() == 1 ? "does" : "do");
  }
  return out;
}

std::string name_laggards(const FlightRecorder& rec, const OpInfo& waited, JobMonitor& monitor,
                          double waited_s) {
  try {
    const std::map<int, std::string> answers = monitor.query_progress(kAnswerWait);
    return describe_laggards(rec, monitor.rank(), waited, answers, monitor.size(), waited_s);
  } catch (const std::exception& e) {
    log::warn("could not name the rank that is behind: {}", e.what());
    return {};
  }
}

}  // namespace quintet::detail
