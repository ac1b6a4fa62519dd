// The NCCL watchdog as a training program meets it (issue #44): an operation held back on the GPU,
// which the program never waits for, must end the process past --timeout-s with an error naming
// the operation and the communicator, after a flight-recorder dump and the communicator's abort.
// tests/reliability/nccl_watchdog_test.sh runs it and checks all of that. One GPU; exit 77 (skip)
// without one.
//
// The communicator is this process's alone ('held', one rank, its own unique id), so the hold-up
// involves no peer. Its first all_reduce completes (waited for); its second is issued on a stream
// that a host function holds back for up to kHold, as a step whose input comes from work that never
// finishes. The program then goes on with host work (sleeps) and never waits for it: only the
// watchdog can end it. Flags: the runtime's (--timeout-s, --flight-dir, --flight-size).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "collectives/flight_recorder.hpp"
#include "collectives/nccl/nccl_backend.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace {

using namespace std::chrono_literals;
constexpr auto kHold = 40s;  // the hold-up's own bound: a failing run must still end
constexpr auto kRun = 30s;   // how long the program goes on without the watchdog

// A host function on the stream: work queued after it waits until kHold has passed.
void hold(void*) { std::this_thread::sleep_for(kHold); }

}  // namespace

int main(int argc, char** argv) {
  using namespace quintet;
  const RuntimeConfig config = RuntimeConfig::from_args(argc, argv);
  if (cuda_device_count() == 0) {
    std::printf("nccl_watchdog: no GPU: skipped\n");
    return 77;
  }
  try {
    detail::NcclOptions options;
    options.timeout_s = config.timeout_s;
    options.flight =
        std::make_shared<detail::FlightRegistry>(0, 1, config.flight_dir, config.flight_size);
    options.world_ranks = {0};
    const Device gpu = Device::cuda(0);
    auto comm =
        detail::nccl_create_communicator(detail::nccl_make_unique_id(), 0, 1, gpu, options, "held");
    const Stream stream = Stream::create(gpu);
    const Tensor t = Tensor::full({4096}, 1.0, DType::f32, gpu);
    comm->all_reduce(t, ReduceOp::sum, stream).synchronize();  // #1: completes
    if (cudaLaunchHostFunc(stream.handle(), &hold, nullptr) != cudaSuccess) {
      std::fprintf(stderr, "nccl_watchdog: cudaLaunchHostFunc failed\n");
      return 3;
    }
    const Work held = comm->all_reduce(t, ReduceOp::sum, stream);  // #2: never waited for
    std::fprintf(stderr,
                 "nccl_watchdog: issued all_reduce #2 on 'held', held back; not waiting "
                 "for it\n");
    std::this_thread::sleep_for(kRun);
    std::fprintf(stderr, "nccl_watchdog: still running after %lld s: no watchdog ended it\n",
                 static_cast<long long>(kRun.count()));
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_watchdog: %s\n", e.what());
    return 3;
  }
}
