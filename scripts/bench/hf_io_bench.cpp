// Import and export of a Hugging Face directory, timed, with the memory each rank holds
// (scripts/bench/hf_io_bench.sh runs it; not a test):
//
//   mpirun -np N hf_io_bench REPEATS EXPORT_DIR|- --init-from-hf DIR [job flags: --tp 2 ...]
//
// Builds the model of DIR's config.json at the job's layout, then REPEATS times loads its weights
// (train::load_hf_weights, each rank its own boxes); with QUINTET_HF_BENCH_DROP_CACHES=1 rank 0
// drops the page cache before each load (root only), so every load reads the disk. With an
// EXPORT_DIR, exports the model REPEATS times at f32 and at bf16 (train::export_hf) into
// EXPORT_DIR/f32_r and EXPORT_DIR/bf16_r, each removed after it is timed, then flushes its files
// to disk (fdatasync, timed apart: export_hf leaves the safetensors files in the page cache).
//
// Prints "key value" lines: rank 0 the times in seconds (import_s, export_f32_s, ...: one value
// per repeat) and the bytes (checkpoint_bytes, export_f32_bytes, ...); every rank its memory,
// "rank R key bytes": model_bytes (its parameters' f32 values), share_bytes (the bf16 bytes of
// its parameters: its share of a BF16 checkpoint), rss_before, anon_before and file_before
// (VmRSS, RssAnon and RssFile once the model is built, before any import), anon_peak and file_peak
// (the largest RssAnon and RssFile seen during the imports, sampled every 2 ms: anonymous memory
// the import allocated, and the checkpoint's pages mapped into the rank), hwm (VmHWM, the peak
// resident set of the whole run until then).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"
#include "quintet/parallel/train/hf_export.hpp"
#include "quintet/parallel/train/job_program.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace {

namespace fs = std::filesystem;

// /proc/self/status's memory lines (kB there), in bytes.
std::map<std::string, std::int64_t> memory_status() {
  std::map<std::string, std::int64_t> out;
  std::ifstream in("/proc/self/status");
  std::string key;
  std::int64_t kb = 0;
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    key = line.substr(0, colon);
    if (key != "VmRSS" && key != "VmHWM" && key != "RssAnon" && key != "RssFile") continue;
    kb = std::atoll(line.c_str() + colon + 1);
    out[key] = kb * 1024;
  }
  return out;
}

// The largest RssAnon and RssFile while it lives.
class MemorySampler {
 public:
  MemorySampler()
      : thread_([this] {
          while (!stop_.load()) {
            const auto m = memory_status();
            anon_peak_ = std::max(anon_peak_, m.at("RssAnon"));
            file_peak_ = std::max(file_peak_, m.at("RssFile"));
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }) {}
  std::pair<std::int64_t, std::int64_t> stop() {
    stop_ = true;
    thread_.join();
    return {anon_peak_, file_peak_};
  }

 private:
  std::atomic<bool> stop_{false};
  std::int64_t anon_peak_ = 0, file_peak_ = 0;
  std::thread thread_;
};

std::int64_t directory_bytes(const fs::path& dir) {
  std::int64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += static_cast<std::int64_t>(e.file_size());
  return total;
}

void flush_files(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    QUINTET_CHECK(fd >= 0 && ::fdatasync(fd) == 0, "hf_io_bench: cannot flush {}",
                  e.path().string());
    ::close(fd);
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct BenchArgs {
  int repeats = 1;
  std::string export_dir;  // "-": no export
  bool drop_caches = false;
};

int bench(const BenchArgs& a, const quintet::train::JobConfig& job, quintet::World& world,
          quintet::Mesh& mesh, quintet::Stream& stream) {
  using namespace quintet;
  const auto barrier = [&] {
    stream.synchronize();
    world.comm().barrier(stream).wait(stream);
    stream.synchronize();
  };
  const train::HfModel hf = train::read_hf_config(job.checkpoint.init_from_hf);
  train::TrainingModel model(job, mesh, stream);
  std::int64_t elements = 0;
  for (const train::TrainingStage& s : model.stages())
    for (const nn::Parameter* p : s.store->parameters()) elements += p->numel();
  barrier();
  const auto before = memory_status();
  std::vector<double> import_s;
  std::pair<std::int64_t, std::int64_t> peaks{0, 0};
  for (int r = 0; r < a.repeats; ++r) {
    if (a.drop_caches && world.rank() == 0) {
      ::sync();
      std::ofstream("/proc/sys/vm/drop_caches") << "1\n";
    }
    barrier();
    MemorySampler sampler;
    const auto t0 = std::chrono::steady_clock::now();
    train::load_hf_weights(hf, model, world.comm());
    barrier();
    import_s.push_back(seconds_since(t0));
    const auto p = sampler.stop();
    peaks = {std::max(peaks.first, p.first), std::max(peaks.second, p.second)};
  }
  const std::int64_t hwm = memory_status().at("VmHWM");
  std::map<std::string, std::vector<double>> export_s;
  std::map<std::string, std::int64_t> export_bytes;
  if (a.export_dir != "-") {
    for (const char* dtype : {"f32", "bf16"}) {
      train::HfExportOptions options;
      options.dtype = train::parse_hf_export_dtype(dtype);
      for (int r = 0; r < a.repeats; ++r) {
        const fs::path out = fs::path(a.export_dir) / fmt::format("{}_{}", dtype, r);
        barrier();
        const auto t0 = std::chrono::steady_clock::now();
        train::export_hf(out.string(), model, world.comm(), options);
        barrier();
        export_s[std::string("export_") + dtype + "_s"].push_back(seconds_since(t0));
        if (world.rank() == 0) {
          const auto t1 = std::chrono::steady_clock::now();
          flush_files(out);
          export_s[std::string("flush_") + dtype + "_s"].push_back(seconds_since(t1));
          export_bytes[std::string("export_") + dtype + "_bytes"] = directory_bytes(out);
          fs::remove_all(out);
        }
        barrier();
      }
    }
  }
  if (world.rank() == 0) {
    std::int64_t checkpoint = 0;
    for (const auto& e : fs::directory_iterator(job.checkpoint.init_from_hf))
      if (e.path().extension() == ".safetensors") checkpoint += e.file_size();
    fmt::print("ranks {}\ncheckpoint_bytes {}\n", world.size(), checkpoint);
    std::string line = "import_s";
    for (double s : import_s) line += fmt::format(" {:.3f}", s);
    fmt::print("{}\n", line);
    for (const auto& [key, values] : export_s) {
      line = key;
      for (double s : values) line += fmt::format(" {:.3f}", s);
      fmt::print("{}\n", line);
    }
    for (const auto& [key, bytes] : export_bytes) fmt::print("{} {}\n", key, bytes);
    std::fflush(stdout);
  }
  // One rank at a time, in order.
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      fmt::print(
          "rank {} model_bytes {}\nrank {} share_bytes {}\nrank {} rss_before {}\n"
          "rank {} anon_before {}\nrank {} file_before {}\nrank {} anon_peak {}\n"
          "rank {} file_peak {}\nrank {} hwm {}\n",
          r, elements * 4, r, elements * 2, r, before.at("VmRSS"), r, before.at("RssAnon"), r,
          before.at("RssFile"), r, peaks.first, r, peaks.second, r, hwm);
      std::fflush(stdout);
    }
    barrier();
  }
  return 0;
}

int run(int argc, char** argv) {
  using namespace quintet;
  BenchArgs a;
  a.repeats = std::atoi(argv[1]);
  a.export_dir = argv[2];
  a.drop_caches = std::getenv("QUINTET_HF_BENCH_DROP_CACHES") != nullptr &&
                  std::string(std::getenv("QUINTET_HF_BENCH_DROP_CACHES")) == "1";
  const auto prepare = [&](const train::JobConfig& job) {
    QUINTET_CHECK(a.repeats >= 1, "hf_io_bench: REPEATS must be at least 1, not {}", argv[1]);
    QUINTET_CHECK(!job.checkpoint.init_from_hf.empty(),
                  "hf_io_bench: --init-from-hf DIR is needed");
  };
  return train::run_job_program("hf_io_bench", argc, argv, 2, train::JobConfig(), prepare,
                                [&](const train::JobConfig& job, World& world, Mesh& mesh,
                                    Stream& stream) { return bench(a, job, world, mesh, stream); });
}

}  // namespace

int main(int argc, char** argv) {
  return quintet::train::job_program_main("hf_io_bench", argc, argv, 2,
                                          "REPEATS EXPORT_DIR|- --init-from-hf DIR [job flags]",
                                          [&] { return run(argc, argv); });
}
