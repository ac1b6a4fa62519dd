// main() of one-process tests. A GPU test (QUINTET_GPU_TEST) exits 77, which ctest reports as
// skipped, when no GPU is visible.
#if QUINTET_CATCH_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdio>

#include "quintet/core/device.hpp"

int main(int argc, char** argv) {
#if QUINTET_GPU_TEST
  if (!quintet::cuda_available()) {
    std::printf("no CUDA GPU visible: skipping\n");
    return 77;
  }
#endif
  return Catch::Session().run(argc, argv);
}
