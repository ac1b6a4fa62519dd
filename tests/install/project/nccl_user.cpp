// Built with quintet::nccl (find_package(quintet COMPONENTS nccl)): NCCL's and the CUDA runtime's
// headers and libraries come with it. Prints the NCCL version it links and the datatype Quintet
// moves bf16 as.
#include <cuda_runtime.h>

#include <cstdio>
#include <quintet/collectives/nccl.hpp>
#include <quintet/quintet.hpp>

int main() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 1;
  int devices = 0;
  (void)cudaGetDeviceCount(&devices);  // no GPU is fine: the link is what is tested
  std::printf("NCCL %d, bf16 travels as NCCL type %d\n", version,
              static_cast<int>(quintet::nccl_datatype(quintet::DType::bf16)));
  return quintet::nccl_datatype(quintet::DType::bf16) == ncclBfloat16 ? 0 : 1;
}
