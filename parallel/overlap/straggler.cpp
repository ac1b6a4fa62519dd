// Stragglers: arrivals matched per group and sequence number (see straggler.hpp).
#include "quintet/parallel/overlap/straggler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>

#include "quintet/parallel/layout.hpp"

namespace quintet::overlap {

namespace {

bool is_collective(std::string_view op) { return op != "send" && op != "recv" && op != "p2p"; }

// values on comm's device, reduced or gathered there, back on the host.
std::vector<double> host_values(const Tensor& t, const Stream& stream) {
  const Tensor h = t.to(Device::cpu(), stream);
  stream.synchronize();
  std::vector<double> out(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) out[static_cast<std::size_t>(i)] = h.item({i});
  return out;
}

Tensor device_values(const std::vector<double>& v, const Communicator& comm, const Stream& stream) {
  const Tensor h = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, Device::cpu());
  return comm.device().is_cpu() ? h : h.to(comm.device(), stream);
}

}  // namespace

int StragglerReport::straggler() const {
  if (collectives == 0 || last_at.empty()) return -1;
  return static_cast<int>(std::max_element(last_at.begin(), last_at.end()) - last_at.begin());
}

StragglerReport find_stragglers(const Mesh& mesh, Communicator& world,
                                const std::vector<trace::TraceEvent>& events, double clock_sync_us,
                                const Stream& stream) {
  const Layout& layout = mesh.layout();
  const int me = mesh.global_rank();
  // counts[r] for each world rank, then the number of collectives compared.
  std::vector<double> counts(static_cast<std::size_t>(layout.world()) + 1, 0.0);
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  for (const Axis axis : kAllAxes) {
    if (layout.group_size(axis) < 2 || !layout.contains(axis, me)) continue;
    Communicator& comm = mesh.comm(axis);
    const std::string_view name = axis_name(axis);
    std::map<std::int64_t, double> arrival;  // seq -> aligned arrival, this rank
    for (const trace::TraceEvent& e : events) {
      if (e.wait || e.group != name || !is_collective(e.name)) continue;
      arrival[e.seq] = (e.issue_us > 0.0 ? e.issue_us : e.start_us) - clock_sync_us;
    }
    // The sequence numbers every rank of the group has: [max of firsts, min of lasts].
    const double lo = arrival.empty() ? std::numeric_limits<double>::max()
                                      : static_cast<double>(arrival.begin()->first);
    const double hi = arrival.empty() ? -std::numeric_limits<double>::max()
                                      : static_cast<double>(arrival.rbegin()->first);
    Tensor range = device_values({lo, -hi}, comm, stream);
    comm.all_reduce(range, ReduceOp::max, stream).wait(stream);
    const std::vector<double> agreed = host_values(range, stream);
    const double first = agreed[0], last = -agreed[1];
    if (!(first <= last)) continue;
    const auto n = static_cast<std::size_t>(last - first) + 1;
    std::vector<double> mine(n, kNone);
    for (const auto& [seq, t] : arrival) {
      if (seq >= first && seq <= last) mine[static_cast<std::size_t>(seq - first)] = t;
    }
    const Tensor in = device_values(mine, comm, stream);
    const Tensor all = Tensor::empty({static_cast<std::int64_t>(n) * comm.size()}, DType::f64,
                                     comm.device(), stream);
    comm.all_gather(in, all, stream).wait(stream);
    if (comm.rank() != 0) continue;  // one rank of the group counts it
    const std::vector<double> times = host_values(all, stream);
    const std::vector<int>& group = layout.group_of(axis, me);
    for (std::size_t s = 0; s < n; ++s) {
      int latest = -1;
      bool complete = true;
      for (int r = 0; r < comm.size(); ++r) {
        const double t = times[static_cast<std::size_t>(r) * n + s];
        if (std::isnan(t)) {
          complete = false;
          break;
        }
        if (latest < 0 || t > times[static_cast<std::size_t>(latest) * n + s]) latest = r;
      }
      if (!complete) continue;
      counts[static_cast<std::size_t>(group[static_cast<std::size_t>(latest)])] += 1.0;
      counts.back() += 1.0;
    }
  }
  Tensor total = device_values(counts, world, stream);
  world.all_reduce(total, ReduceOp::sum, stream).wait(stream);
  const std::vector<double> summed = host_values(total, stream);
  StragglerReport report;
  for (std::size_t r = 0; r + 1 < summed.size(); ++r)
    report.last_at.push_back(static_cast<std::int64_t>(std::llround(summed[r])));
  report.collectives = static_cast<std::int64_t>(std::llround(summed.back()));
  return report;
}

}  // namespace quintet::overlap
