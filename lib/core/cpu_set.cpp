#include "quintet/core/cpu_set.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

// The kernel's masks can hold more CPUs than CPU_SETSIZE (1024) on large machines: size them from
// the number of configured CPUs.
int mask_cpus() {
  const long n = sysconf(_SC_NPROCESSORS_CONF);
  return static_cast<int>(std::max<long>(n, CPU_SETSIZE));
}

CpuSet from_mask(const cpu_set_t* mask, std::size_t bytes, int n) {
  std::vector<int> cpus;
  for (int c = 0; c < n; ++c) {
    if (CPU_ISSET_S(static_cast<std::size_t>(c), bytes, mask)) cpus.push_back(c);
  }
  return CpuSet(std::move(cpus));
}

CpuSet affinity_of(pid_t tid) {
  const int n = mask_cpus();
  cpu_set_t* mask = CPU_ALLOC(n);
  const std::size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, mask);
  const int rc = sched_getaffinity(tid, bytes, mask);
  const int err = errno;
  CpuSet out = rc == 0 ? from_mask(mask, bytes, n) : CpuSet();
  CPU_FREE(mask);
  if (rc != 0) QUINTET_THROW(System, "sched_getaffinity of thread {}: {}", tid, std::strerror(err));
  return out;
}

}  // namespace

CpuSet::CpuSet(std::vector<int> cpus) : cpus_(std::move(cpus)) {
  std::sort(cpus_.begin(), cpus_.end());
  cpus_.erase(std::unique(cpus_.begin(), cpus_.end()), cpus_.end());
  QUINTET_CHECK(cpus_.empty() || cpus_.front() >= 0, "CpuSet: CPU {} is negative", cpus_.front());
}

CpuSet CpuSet::parse(std::string_view list) {
  std::vector<int> cpus;
  std::string_view rest = list;
  while (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
  auto number = [&](std::string_view text) {
    int x = -1;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
    QUINTET_CHECK(ec == std::errc() && ptr == text.data() + text.size() && x >= 0,
                  "CpuSet::parse: expected a CPU list like '0-3,8', got '{}'", list);
    return x;
  };
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    QUINTET_CHECK(!item.empty() && (comma == std::string_view::npos || !rest.empty()),
                  "CpuSet::parse: expected a CPU list like '0-3,8', got '{}'", list);
    const auto dash = item.find('-');
    const int lo = number(item.substr(0, dash));
    const int hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    QUINTET_CHECK(lo <= hi, "CpuSet::parse: range {} runs backwards in '{}'", item, list);
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return CpuSet(std::move(cpus));
}

bool CpuSet::contains(int cpu) const { return std::binary_search(cpus_.begin(), cpus_.end(), cpu); }

bool CpuSet::contains(const CpuSet& other) const {
  return std::includes(cpus_.begin(), cpus_.end(), other.cpus_.begin(), other.cpus_.end());
}

bool CpuSet::intersects(const CpuSet& other) const { return !intersection(other).empty(); }

CpuSet CpuSet::intersection(const CpuSet& other) const {
  std::vector<int> both;
  std::set_intersection(cpus_.begin(), cpus_.end(), other.cpus_.begin(), other.cpus_.end(),
                        std::back_inserter(both));
  return CpuSet(std::move(both));
}

std::string CpuSet::str() const {
  std::string out;
  for (std::size_t i = 0; i < cpus_.size();) {
    std::size_t j = i;
    while (j + 1 < cpus_.size() && cpus_[j + 1] == cpus_[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus_[i]) : fmt::format("{}-{}", cpus_[i], cpus_[j]);
    i = j + 1;
  }
  return out;
}

CpuSet calling_thread_cpus() { return affinity_of(0); }

CpuSet thread_cpus(int tid) { return affinity_of(static_cast<pid_t>(tid)); }

void bind_calling_thread(const CpuSet& cpus) {
  QUINTET_CHECK(!cpus.empty(), "bind_calling_thread: no CPU given");
  const int n = std::max(mask_cpus(), cpus.cpus().back() + 1);
  cpu_set_t* mask = CPU_ALLOC(n);
  const std::size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, mask);
  for (int c : cpus.cpus()) CPU_SET_S(static_cast<std::size_t>(c), bytes, mask);
  const int rc = sched_setaffinity(0, bytes, mask);
  const int err = errno;
  CPU_FREE(mask);
  if (rc != 0) {
    QUINTET_THROW(System,
                  "bind_calling_thread: sched_setaffinity to CPUs {}: {} (CPUs outside this "
                  "process's cgroup, or offline?)",
                  cpus.str(), std::strerror(err));
  }
}

CpuSet online_cpus() {
  std::ifstream in("/sys/devices/system/cpu/online");
  std::string line;
  if (in && std::getline(in, line) && !line.empty()) return CpuSet::parse(line);
  std::vector<int> all(static_cast<std::size_t>(std::max<long>(sysconf(_SC_NPROCESSORS_CONF), 1)));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return CpuSet(std::move(all));
}

}  // namespace quintet
