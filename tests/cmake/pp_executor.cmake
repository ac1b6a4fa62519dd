# The pipeline executor under mpirun: one step under every schedule and layout (pp with tp, sp, dp,
# ZeRO-1, up to pp 2 x tp 2 x dp 2 at 8 ranks) against the whole model on one rank, and its bad
# inputs.
quintet_mpi_test(NAME pp_executor_test COMPONENT pp RANKS 2 3 4 8 SOURCES mpi/pp_executor_test.cpp)
