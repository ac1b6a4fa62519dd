// main() of multi-rank tests run under mpirun: MPI is initialised (MPI_THREAD_MULTIPLE) around
// the Catch session, and the exit code is the worst of all ranks, so one failing rank fails the
// test. A GPU test
// (QUINTET_GPU_TEST) exits 77 on every rank when some rank has no GPU of its own.
#if QUINTET_CATCH_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "quintet/core/device.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
#if QUINTET_GPU_TEST
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_size = 1;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int enough = quintet::cuda_device_count() >= local_size ? 1 : 0, all_enough = 0;
  MPI_Allreduce(&enough, &all_enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_enough) {
    if (rank == 0) std::printf("fewer GPUs than ranks per node: skipping\n");
    MPI_Finalize();
    return 77;
  }
#endif
  Catch::Session session;
  int result = session.applyCommandLine(argc, argv);
  if (result == 0) result = session.run();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != 0)
    std::printf("a rank failed (worst exit code %d of %d ranks)\n", worst, size);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
