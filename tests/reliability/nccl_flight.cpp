// A skipped collective on a mesh axis over NCCL (issue #44), as a training job meets it: two ranks,
// one GPU each, dp 2 (the mesh's 'dp' is an NCCL split of the world). Both complete all_reduce #1
// on 'dp'; rank 1 then skips #2 and writes its flight recorder (World::dump_flight), while rank 0
// waits for #2 until --timeout-s: a Timeout whose message names rank 1 under mpirun (the ranks
// compare their progress over the job monitor) and ends with the path of rank 0's dump, which rank
// 0 prints before World::fail. tests/reliability/nccl_flight_test.sh runs it under mpirun and with
// RANK/WORLD_SIZE and checks that the dumps have 'dp (nccl)' with world ranks 0-1 and that
// scripts/analyze_flight.py names rank 1. Exit 77 (skip) with fewer than 2 GPUs; exit 4 when #2
// completes.
//
// A first argument `watchdog` (before the runtime's flags) makes rank 0 issue #2 and never wait
// for it, so that the communicator's watchdog ends the job, naming rank 1; `watchdog-stop` also
// makes rank 1 stop itself (SIGSTOP) instead of sleeping, so that it never answers. Exit 4 when
// the process is still running long after the timeout. Flags: the runtime's (--device cuda,
// --timeout-s, --flight-dir).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/error.hpp"
#include "quintet/parallel/mesh.hpp"

int main(int argc, char** argv) {
  using namespace quintet;
  if (cuda_device_count() < 2) {
    std::printf("nccl_flight: %d GPU(s) visible, 2 needed: skipped\n", cuda_device_count());
    return 77;
  }
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const bool watchdog = mode == "watchdog" || mode == "watchdog-stop";
  if (watchdog) {  // not a runtime flag: init must not see it
    argv[1] = argv[0];
    --argc;
    ++argv;
  }
  World world = init(argc, argv);
  try {
    QUINTET_CHECK(world.size() == 2 && world.device().is_cuda(),
                  "run it on 2 ranks with --device cuda, not {} rank(s) on {}", world.size(),
                  world.device().str());
    const Mesh mesh(Layout(ParallelConfig{}, world.size()), world.comm());
    Communicator& dp = mesh.comm(Axis::dp);
    const Stream stream = Stream::create(world.device());
    const Tensor t = Tensor::full({4096}, 1.0, DType::f32, world.device());
    dp.all_reduce(t, ReduceOp::sum, stream).synchronize();  // #1, on both ranks
    const auto timeout = std::chrono::duration<double>(world.config().timeout_s);
    if (world.rank() == 1 && mode == "watchdog-stop") {
      std::printf("nccl_flight: rank 1 skips all_reduce #2 on 'dp' and stops\n");
      std::fflush(stdout);
      std::raise(SIGSTOP);  // until the job is ended
      return 0;
    }
    if (world.rank() == 1) {
      // The recorder marks #1 completed when the communicator's watchdog sees it (it polls at a
      // tenth of the timeout): let it, then dump.
      std::this_thread::sleep_for(timeout / 4);
      const std::string path = world.dump_flight("rank 1 skips all_reduce #2 on 'dp'");
      std::printf("nccl_flight: rank 1 skipped all_reduce #2 on 'dp' (flight recorder: %s)\n",
                  path.c_str());
      std::fflush(stdout);
      // Until rank 0 has timed out (under mpirun its failure then ends the job).
      std::this_thread::sleep_for(timeout * (watchdog ? 4 : 2));
      return 0;
    }
    if (watchdog) {
      const Work held = dp.all_reduce(t, ReduceOp::sum, stream);  // #2: never waited for
      std::fprintf(stderr,
                   "nccl_flight: rank 0 issued all_reduce #2 on 'dp'; not waiting for it\n");
      std::this_thread::sleep_for(timeout * 4);
      std::printf("nccl_flight: rank 0 still running: no watchdog ended it\n");
      return 4;
    }
    dp.all_reduce(t, ReduceOp::sum, stream).synchronize();  // #2: rank 1 never issues it
    std::printf("nccl_flight: all_reduce #2 completed without rank 1\n");
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_flight: rank %d: %s\n", world.rank(), e.what());
    world.fail(e, 3);
    return 3;
  }
}
