// A program that is not a trainer gets the first error to every rank too (issue #21): the last
// rank throws after a few all_reduces while the others go on issuing them. Its handler is
//   --handler fail     inside the World's scope: prints, then World::fail(e, 3);
//   --handler outside  outside it: the exception leaves the World's scope (its destructor tells
//                      the others), then the handler prints and returns 3.
// tests/reliability/world_failure_test.sh runs it and checks what every rank says.
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/tensor.hpp"

namespace {

void work(quintet::World& world) {
  quintet::Tensor t = quintet::Tensor::full({16}, 1.0);
  for (int i = 0; i < 5; ++i) world.comm().all_reduce(t).synchronize();
  if (world.rank() == world.size() - 1) throw std::runtime_error("the last rank breaks");
  for (int i = 0; i < 5; ++i) world.comm().all_reduce(t).synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  const bool outside = argc > 2 && std::strcmp(argv[2], "outside") == 0;
  try {
    quintet::World world = quintet::init(argc, argv);
    if (outside) {
      work(world);
      return 0;
    }
    try {
      work(world);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "world_failure: %s\n", e.what());
      world.fail(e, 3);
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "world_failure: %s\n", e.what());
    return 3;
  }
}
