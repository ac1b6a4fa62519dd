# Overlap: the meter of communication and exposed time (one process), and TimedCommunicator, which
# measures through it, on the MPI world (the Self backend at one rank).
quintet_unit_test(NAME overlap_meter_test COMPONENT overlap SOURCES unit/overlap_meter_test.cpp)
quintet_unit_test(NAME overlap_chunk_pipeline_test COMPONENT overlap
                  SOURCES unit/overlap_chunk_pipeline_test.cpp)
quintet_mpi_test(NAME overlap_timed_communicator_test COMPONENT overlap RANKS 1 2 3
                 SOURCES mpi/overlap_timed_communicator_test.cpp)
# The trace recorder on CPU ranks: MPI operations and waits with their kinds, steps, the ring, the
# JSON, and the straggler report (tp 2 x dp 2 at 4 ranks, dp only at 3).
quintet_mpi_test(NAME overlap_trace_test COMPONENT overlap RANKS 1 3 4
                 SOURCES mpi/overlap_trace_test.cpp)
set_property(TEST overlap_trace_test_np1 overlap_trace_test_np3 overlap_trace_test_np4 APPEND
             PROPERTY LABELS trace)
# Timing-sensitive (a rank made late by a sleep; measured intervals): run alone.
set_tests_properties(overlap_trace_test_np1 overlap_trace_test_np3 overlap_trace_test_np4
                     PROPERTIES RUN_SERIAL TRUE)
