# Reliability (issue #21): failures become errors. The MPI backend's deadlines and the first
# error of one rank reaching the others (tests/mpi/collectives_failure_test.cpp, on the private
# JobMonitor), and whole-trainer runs in which one rank throws alone or is stopped
# (tests/reliability/trainer_failure_test.sh says what each case checks).
quintet_mpi_test(NAME collectives_failure_test COMPONENT reliability RANKS 2 3 TIMEOUT 120
                 SOURCES mpi/collectives_failure_test.cpp)
target_link_libraries(collectives_failure_test PRIVATE quintet_collectives_private)
set_property(TEST collectives_failure_test_np2 collectives_failure_test_np3 APPEND PROPERTY
             LABELS collectives)
