#include "gpu_spin.hpp"

#include <cuda_runtime.h>

namespace {

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns, const int* tokens, int* never) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
  }
  if (tokens[0] < 0) *never = 1;  // token ids are >= 0: only makes the read observable
}

}  // namespace

void gpu_spin(double ms, const int* tokens, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(ms * 1e6), tokens, nullptr);
}
