// CpuSet: a set of logical CPUs, numbered as the kernel numbers them (taskset, numactl and the
// Cpus_allowed_list line of /proc/<pid>/status), and the calls that read and set where a thread
// may run. Linux only (sched_getaffinity / sched_setaffinity).
//
//   CpuSet cores = CpuSet::parse("0-3,8");          // {0, 1, 2, 3, 8}
//   bind_calling_thread(cores);                     // this thread, and threads it starts later
//   cores.str();                                    // "0-3,8"
//
// A thread started by another inherits that thread's CPUs (Linux): quintet::init places the
// calling thread before it starts any of Quintet's threads (core/topology.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace quintet {

class CpuSet {
 public:
  CpuSet() = default;
  // The CPUs given, sorted, duplicates removed. Throws InvalidArgument for a negative CPU.
  explicit CpuSet(std::vector<int> cpus);
  // Parses a CPU list: comma-separated CPUs and ranges ("0-3,8,10-11"; "" is the empty set).
  // Throws InvalidArgument naming the text otherwise.
  static CpuSet parse(std::string_view list);

  const std::vector<int>& cpus() const { return cpus_; }  // ascending
  int size() const { return static_cast<int>(cpus_.size()); }
  bool empty() const { return cpus_.empty(); }
  bool contains(int cpu) const;
  // Every CPU of other is in this set.
  bool contains(const CpuSet& other) const;
  bool intersects(const CpuSet& other) const;
  CpuSet intersection(const CpuSet& other) const;
  // The list form parse() reads: "0-3,8"; "" for the empty set.
  std::string str() const;

  friend bool operator==(const CpuSet& a, const CpuSet& b) { return a.cpus_ == b.cpus_; }
  friend bool operator!=(const CpuSet& a, const CpuSet& b) { return !(a == b); }

 private:
  std::vector<int> cpus_;
};

// The CPUs the calling thread may run on.
CpuSet calling_thread_cpus();
// The CPUs thread tid of this process may run on (a task id, as listed in /proc/self/task).
// Throws System when the thread does not exist.
CpuSet thread_cpus(int tid);
// Restricts the calling thread to cpus; threads it starts afterwards inherit them. Throws
// InvalidArgument for an empty set, System when the kernel refuses (a CPU outside the process's
// cgroup or offline).
void bind_calling_thread(const CpuSet& cpus);
// The CPUs online on this machine (/sys/devices/system/cpu/online; without it, 0 to the number of
// configured CPUs - 1).
CpuSet online_cpus();

}  // namespace quintet
