# Overlap: the meter of communication and exposed time (one process), and TimedCommunicator, which
# measures through it, on the MPI world (the Self backend at one rank).
quintet_unit_test(NAME overlap_meter_test COMPONENT overlap SOURCES unit/overlap_meter_test.cpp)
quintet_unit_test(NAME overlap_chunk_pipeline_test COMPONENT overlap
                  SOURCES unit/overlap_chunk_pipeline_test.cpp)
quintet_mpi_test(NAME overlap_timed_communicator_test COMPONENT overlap RANKS 1 2 3
                 SOURCES mpi/overlap_timed_communicator_test.cpp)
