# Reliability (issue #21): failures become errors. The MPI backend's deadlines and the first
# error of one rank reaching the others (tests/mpi/collectives_failure_test.cpp, on the private
# JobMonitor), and whole-trainer runs in which one rank throws alone or is stopped
# (tests/reliability/trainer_failure_test.sh says what each case checks).
quintet_mpi_test(NAME collectives_failure_test COMPONENT reliability RANKS 2 3 TIMEOUT 120
                 SOURCES mpi/collectives_failure_test.cpp)
target_link_libraries(collectives_failure_test PRIVATE quintet_collectives_private)
set_property(TEST collectives_failure_test_np2 collectives_failure_test_np3 APPEND PROPERTY
             LABELS collectives)
# Timing-sensitive (waits measured against deadlines), as are the scripts below: run alone.
set_tests_properties(collectives_failure_test_np2 collectives_failure_test_np3 PROPERTIES
                     RUN_SERIAL TRUE)

# The examples are added after the tests: their targets are looked up at generate time.
if(QUINTET_BUILD_EXAMPLES)
  foreach(case throw stop flight)
    add_test(NAME reliability_trainer_${case}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/trainer_failure_test.sh
                     "$<$<TARGET_EXISTS:04_gpt_train>:$<TARGET_FILE:04_gpt_train>>"
                     ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/reliability_runs ${case}
                     ${QUINTET_MPIRUN_FLAGS})
    set_tests_properties(reliability_trainer_${case} PROPERTIES
                         LABELS "mpi;reliability;example" TIMEOUT 180
                         PASS_REGULAR_EXPRESSION "trainer_failure_test ${case}: PASS"
                         SKIP_REGULAR_EXPRESSION "trainer_failure_test: SKIP"
                         ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1" RUN_SERIAL TRUE)
    quintet_mpi_processors(3 reliability_trainer_${case})  # dp 3 at most
  endforeach()
  quintet_mpi_processors(8 reliability_trainer_flight)  # dp 2 x tp 2 x pp 2
endif()

# Any program: World::fail in a handler, and an exception that leaves the World's scope.
add_executable(reliability_world_failure reliability/world_failure.cpp)
target_link_libraries(reliability_world_failure PRIVATE quintet::quintet)
add_test(NAME reliability_world_failure
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/world_failure_test.sh
                 $<TARGET_FILE:reliability_world_failure> ${MPIEXEC_EXECUTABLE}
                 ${QUINTET_MPIRUN_FLAGS})
set_tests_properties(reliability_world_failure PROPERTIES LABELS "mpi;reliability;collectives"
                     TIMEOUT 300 PASS_REGULAR_EXPRESSION "world_failure_test: PASS"
                     ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1" RUN_SERIAL TRUE)
quintet_mpi_processors(3 reliability_world_failure)

# The collective-consistency debug mode (--check-collectives): mismatches name both ranks, a
# skipped operation is "rank k never reached seq s", matched operations give the right results.
quintet_mpi_test(NAME collectives_check_test COMPONENT reliability RANKS 2 3 TIMEOUT 120
                 SOURCES mpi/collectives_check_test.cpp)
set_property(TEST collectives_check_test_np2 collectives_check_test_np3 APPEND PROPERTY
             LABELS collectives)
if(QUINTET_BUILD_EXAMPLES)
  add_test(NAME reliability_check_collectives_trainer
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/check_collectives_trainer_test.sh
                   "$<$<TARGET_EXISTS:04_gpt_train>:$<TARGET_FILE:04_gpt_train>>"
                   ${MPIEXEC_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/reliability_runs
                   ${QUINTET_MPIRUN_FLAGS})
  set_tests_properties(reliability_check_collectives_trainer PROPERTIES
                       LABELS "mpi;reliability;example" TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "check_collectives_trainer_test: PASS"
                       SKIP_REGULAR_EXPRESSION "check_collectives_trainer_test: SKIP"
                       ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  quintet_mpi_processors(4 reliability_check_collectives_trainer)
endif()

# The flight recorder (issue #44): a skipped collective named by the timeout message and by
# scripts/analyze_flight.py, a mismatched count named by the analyzer, SIGUSR1 dumps a running job
# (tests/reliability/flight_test.sh). Timing-sensitive: run alone.
add_executable(reliability_flight reliability/flight.cpp)
target_link_libraries(reliability_flight PRIVATE quintet::quintet)
foreach(case skip mismatch usr1)
  add_test(NAME reliability_flight_${case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/flight_test.sh
                   $<TARGET_FILE:reliability_flight> ${MPIEXEC_EXECUTABLE}
                   ${PROJECT_SOURCE_DIR}/scripts/analyze_flight.py ${case} ${QUINTET_MPIRUN_FLAGS})
  set_tests_properties(reliability_flight_${case} PROPERTIES LABELS "mpi;reliability;collectives"
                       TIMEOUT 120 RUN_SERIAL TRUE
                       PASS_REGULAR_EXPRESSION "flight_test ${case}: PASS"
                       ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  quintet_mpi_processors(4 reliability_flight_${case})
endforeach()

# The NCCL watchdog's expiry names the rank that is behind (issue #44), driven on the CPU: a
# Watchdog over an operation that never completes, its handler asking the other ranks through the
# JobMonitor as nccl_state.cpp does; the last rank withholds the operation, or is stopped (SIGSTOP).
# Timing-sensitive (the exchange's bound is measured): run alone.
quintet_mpi_test(NAME collectives_watchdog_laggard_test COMPONENT reliability RANKS 2 3 TIMEOUT 60
                 SOURCES mpi/collectives_watchdog_laggard_test.cpp)
target_link_libraries(collectives_watchdog_laggard_test PRIVATE quintet_collectives_private)
set_tests_properties(collectives_watchdog_laggard_test_np2 collectives_watchdog_laggard_test_np3
                     PROPERTIES RUN_SERIAL TRUE)

# The NCCL watchdog on a GPU (issue #44): a held-back all_reduce that the program never waits for
# ends the process within the timeout, naming the operation and the communicator, after a flight
# recorder dump and the communicator's abort (tests/reliability/nccl_watchdog_test.sh). A gpu test:
# exit 77 (skipped) without a GPU.
if(QUINTET_HAS_NCCL)
  add_executable(reliability_nccl_watchdog reliability/nccl_watchdog.cpp)
  target_link_libraries(reliability_nccl_watchdog PRIVATE quintet_collectives_private quintet::nccl)
  add_test(NAME gpu_nccl_watchdog
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/nccl_watchdog_test.sh
                   $<TARGET_FILE:reliability_nccl_watchdog>
                   ${PROJECT_SOURCE_DIR}/scripts/analyze_flight.py)
  set_tests_properties(gpu_nccl_watchdog PROPERTIES LABELS "gpu;reliability;collectives"
                       SKIP_RETURN_CODE 77 TIMEOUT 90 RUN_SERIAL TRUE)
endif()

# A skipped collective on the mesh's NCCL 'dp' axis (issue #44): the Timeout names the operation and
# the dump (and, under mpirun, the rank that never reached it), both ranks dump 'dp (nccl)' with its
# world ranks, and scripts/analyze_flight.py names the rank, under mpirun and with RANK/WORLD_SIZE;
# with the operation never waited for, the watchdog's error names the rank, asleep or stopped
# (tests/reliability/nccl_flight_test.sh). A gpu test: exit 77 (skipped) with fewer than 2 GPUs.
if(QUINTET_HAS_NCCL)
  add_executable(reliability_nccl_flight reliability/nccl_flight.cpp)
  target_link_libraries(reliability_nccl_flight PRIVATE quintet::quintet)
  add_test(NAME gpu_nccl_flight
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/reliability/nccl_flight_test.sh
                   $<TARGET_FILE:reliability_nccl_flight>
                   ${PROJECT_SOURCE_DIR}/scripts/analyze_flight.py ${MPIEXEC_EXECUTABLE}
                   ${QUINTET_MPIRUN_FLAGS})
  set_tests_properties(gpu_nccl_flight PROPERTIES LABELS "gpu;reliability;collectives"
                       SKIP_RETURN_CODE 77 TIMEOUT 240 RUN_SERIAL TRUE)
endif()
