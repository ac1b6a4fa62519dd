// A GPU kernel summary of any CUDA program, by LD_PRELOAD (no Nsight Systems needed): every kernel
// the process runs is recorded through CUPTI's activity API, and at exit the kernels are summed
// by name into KERNEL_SUMMARY_OUT (a CSV: name, calls, total ms, mean us, share of kernel time),
// most time first. The same numbers for our trainer and for PyTorch's say where a step's GPU time
// goes on each side (docs/PERFORMANCE.md); scripts/bench/kernel_groups.py sums them by kind of
// kernel per step. bench_common.sh's kernel_summary_lib builds it, its run_profile runs a
// benchmark under it (moe_benchmarks.sh's moe_profile); by hand:
//
//   g++ -O2 -shared -fPIC scripts/bench/kernel_summary.cpp -I/usr/local/cuda/include \
//       -L/usr/local/cuda/lib64 -lcupti -o build/libkernel_summary.so
//   KERNEL_SUMMARY_OUT=ours.csv LD_PRELOAD=build/libkernel_summary.so ./04_gpt_train ...
//   KERNEL_SUMMARY_OUT=torch.csv LD_PRELOAD=build/libkernel_summary.so python3 gpt_torch.py ...
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Totals {
  std::uint64_t calls = 0;
  std::uint64_t ns = 0;
};

std::mutex mutex;
std::map<std::string, Totals>* totals = nullptr;  // leaked: outlives every static destructor
std::uint64_t records = 0, buffers = 0;

constexpr std::size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  ++buffers;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    ++records;
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    Totals& t = (*totals)[k->name != nullptr ? k->name : "?"];
    ++t.calls;
    t.ns += k->end - k->start;
  }
  std::free(buffer);
}

void write_summary() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mutex);
  // Helper processes a program starts (MPI's, a compiler's) run no kernel: they leave the file
  // to the process that did.
  if (totals->empty()) return;
  const char* path = std::getenv("KERNEL_SUMMARY_OUT");
  std::FILE* out = path != nullptr ? std::fopen(path, "w") : stderr;
  if (out == nullptr) return;
  std::vector<std::pair<std::string, Totals>> rows(totals->begin(), totals->end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::fprintf(stderr, "kernel_summary: %llu activity records in %llu buffers, %zu kernels\n",
               static_cast<unsigned long long>(records), static_cast<unsigned long long>(buffers),
               rows.size());
  std::uint64_t all = 0;
  for (const auto& r : rows) all += r.second.ns;
  std::fprintf(out, "name,calls,total_ms,mean_us,share\n");
  for (const auto& [name, t] : rows) {
    std::string quoted = name;
    std::replace(quoted.begin(), quoted.end(), '"', '\'');
    std::fprintf(out, "\"%s\",%llu,%.3f,%.2f,%.4f\n", quoted.c_str(),
                 static_cast<unsigned long long>(t.calls), t.ns / 1e6,
                 t.ns / 1e3 / static_cast<double>(t.calls),
                 all > 0 ? static_cast<double>(t.ns) / static_cast<double>(all) : 0.0);
  }
  if (out != stderr) std::fclose(out);
}

__attribute__((constructor)) void start() {
  totals = new std::map<std::string, Totals>();
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_summary: CUPTI could not be enabled\n");
    return;
  }
  std::atexit(write_summary);
  // Completed buffers reach buffer_completed only when flushed: flush while the CUDA contexts
  // live (at exit they may be gone with their records).
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cuptiActivityFlushAll(0);
    }
  }).detach();
}

}  // namespace
