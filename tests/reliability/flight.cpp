// The flight recorder on a small job (issue #44); tests/reliability/flight_test.sh runs it.
//   --mode skip      every rank issues 5 all_reduces on a communicator named 'pp'; the last rank
//                    skips the fifth and idles: the others' waits time out naming it
//   --mode mismatch  the third all_reduce has 8 elements on the last rank, 16 elsewhere; every
//                    rank then dumps on demand (if the mismatch did not end the job first)
//   --mode loop      all_reduces for --seconds, then a clean exit (SIGUSR1 dumps meanwhile)
// Runtime flags (--timeout-s, --flight-dir, ...) go to quintet::init.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/tensor.hpp"

namespace {

void run(quintet::World& world, const std::string& mode, double seconds) {
  auto pp = world.comm().split(0, world.rank(), "pp");
  const bool last = world.rank() == world.size() - 1;
  std::printf("flight: rank %d ready\n", world.rank());
  std::fflush(stdout);
  if (mode == "skip") {
    quintet::Tensor t = quintet::Tensor::full({16}, 1.0);
    for (int i = 0; i < 5; ++i) {
      if (i == 4 && last) {
        std::this_thread::sleep_for(std::chrono::seconds(60));  // ended by the others' failure
      }
      pp->all_reduce(t).synchronize();
    }
  } else if (mode == "mismatch") {
    for (int i = 0; i < 4; ++i) {
      quintet::Tensor t = quintet::Tensor::full({i == 2 && last ? 8 : 16}, 1.0);
      pp->all_reduce(t).synchronize();
    }
    world.dump_flight("end of the mismatch test");
  } else if (mode == "loop") {
    quintet::Tensor t = quintet::Tensor::full({1024}, 1.0);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int n = 0;
    // Every rank does the same number of operations: rank 0 decides when to stop.
    quintet::Tensor go = quintet::Tensor::full({1}, 1.0);
    while (go.item({0}) > 0) {
      pp->all_reduce(t).synchronize();
      go.fill_(world.rank() != 0 || std::chrono::steady_clock::now() < end ? 1.0 : 0.0);
      pp->all_reduce(go, quintet::ReduceOp::min).synchronize();
      ++n;
    }
    std::printf("flight: rank %d done after %d steps\n", world.rank(), n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "skip";
  double seconds = 10;
  quintet::RuntimeConfig config = quintet::RuntimeConfig::from_args(argc, argv);
  const auto& args = config.remaining_args;
  for (std::size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--mode") {
      mode = args[i + 1];
    } else if (args[i] == "--seconds") {
      seconds = std::stod(args[i + 1]);
    } else {
      std::fprintf(stderr, "flight: unknown flag %s\n", args[i].c_str());
      return 2;
    }
  }
  try {
    quintet::World world = quintet::init(config);
    try {
      run(world, mode, seconds);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "flight: %s\n", e.what());
      world.fail(e, 3);
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flight: %s\n", e.what());
    return 3;
  }
}
