# Collectives: communicators (MPI, Self; NCCL in collectives_gpu.cmake), Work, bootstrap and the
# TCP store.
quintet_mpi_test(NAME collectives_ops_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_ops_test.cpp)
quintet_mpi_test(NAME collectives_validation_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_validation_test.cpp)
quintet_mpi_test(NAME collectives_split_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_split_test.cpp)
