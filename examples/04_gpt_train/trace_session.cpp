#include "trace_session.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <utility>

#include "quintet/core/trace.hpp"
#include "quintet/parallel/layout.hpp"

namespace gpt {

TraceSession::TraceSession(std::string dir, std::int64_t first, std::int64_t last,
                           const quintet::Mesh& mesh, quintet::Communicator& world,
                           const quintet::Stream& stream)
    : dir_(std::move(dir)),
      first_(first),
      last_(last),
      on_(!dir_.empty() && first <= last),
      mesh_(mesh),
      world_(world),
      stream_(stream) {}

void TraceSession::begin(std::int64_t step) {
  if (step == first_) {
    std::filesystem::create_directories(dir_);
    // The ranks' common instant: each reads its clock as it leaves the barrier.
    world_.barrier(stream_).synchronize();
    clock_sync_us_ = quintet::trace::to_us(quintet::trace::Clock::now());
    quintet::trace::start();
  }
  quintet::trace::begin_step(step, stream_);
}

void TraceSession::end(std::int64_t step) {
  quintet::trace::end_step();
  if (step != last_) return;
  quintet::trace::stop();
  const std::vector<quintet::trace::TraceEvent> events = quintet::trace::events();
  events_ = static_cast<std::int64_t>(events.size());
  // The groups this rank is in (world ranks, in group order), for matching operations across
  // ranks; the layout's sizes.
  const quintet::Layout& layout = mesh_.layout();
  std::string groups;
  for (const quintet::Axis axis : quintet::kAllAxes) {
    if (!layout.contains(axis, mesh_.global_rank())) continue;
    groups += fmt::format("{}\"{}\": [{}]", groups.empty() ? "" : ", ", quintet::axis_name(axis),
                          fmt::join(layout.group_of(axis, mesh_.global_rank()), ", "));
  }
  const std::string extra = fmt::format(
      "\"clock_sync_us\": {:.3f}, \"world\": {}, \"steps\": [{}, {}], \"device\": \"{}\", "
      "\"groups\": {{{}}}",
      clock_sync_us_, layout.world(), first_, last_, stream_.device().str(), groups);
  quintet::trace::write_chrome_json(fmt::format("{}/trace_rank{}.json", dir_, mesh_.global_rank()),
                                    mesh_.global_rank(), extra);
  stragglers_ = quintet::overlap::find_stragglers(mesh_, world_, events, clock_sync_us_, stream_);
}

void TraceSession::print_report(bool json) const {
  if (!on_ || !stragglers_) return;
  const quintet::overlap::StragglerReport& s = *stragglers_;
  const int who = s.straggler();
  const std::int64_t count = who >= 0 ? s.last_at[static_cast<std::size_t>(who)] : 0;
  if (json) {
    fmt::print(
        "{{\"trace_dir\": \"{}\", \"trace_steps\": [{}, {}], \"collectives_compared\": {}, "
        "\"straggler\": {}, \"straggler_last_at\": {}, \"last_at\": [{}]}}\n",
        dir_, first_, last_, s.collectives, who, count, fmt::join(s.last_at, ", "));
    return;
  }
  fmt::print("trace: steps {}-{} written to {}/trace_rank*.json ({} events on rank 0)\n", first_,
             last_, dir_, events_);
  if (who < 0) {
    fmt::print("straggler: no collective of more than one rank was traced\n");
  } else {
    fmt::print(
        "straggler: rank {} arrived last at {} of {} collectives ({:.0f}%); per rank: [{}]\n", who,
        count, s.collectives,
        100.0 * static_cast<double>(count) / static_cast<double>(s.collectives),
        fmt::join(s.last_at, ", "));
  }
}

}  // namespace gpt
