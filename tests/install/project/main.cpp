// The README's minimal program, built against an installed Quintet: init, a tensor on this rank's
// device, an all-reduce of the rank ids. Run alone it is one rank; under mpirun, N ranks.
#include <quintet/quintet.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  quintet::World world = quintet::init(argc, argv);  // MPI under mpirun, NCCL on GPUs
  quintet::Device dev = world.device();              // cuda:<local rank>, or cpu
  quintet::Tensor x = quintet::Tensor::full({1024}, world.rank(), quintet::DType::f32, dev);
  world.comm().all_reduce(x, quintet::ReduceOp::sum).synchronize();
  if (world.rank() == 0) std::printf("sum of ranks: %.0f\n", x.item({0}));

  // Beyond the README: the result is checked, and bad input is a quintet::Error.
  const double expected = world.size() * (world.size() - 1) / 2.0;
  try {
    (void)x.view({7, -1});
    return 1;
  } catch (const quintet::Error& e) {
    if (world.rank() == 0) std::printf("rejected as expected: %s\n", e.what());
  }
  return x.item({1023}) == expected ? 0 : 1;
}
