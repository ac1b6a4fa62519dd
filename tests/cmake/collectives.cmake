# Collectives: communicators (MPI, Self; NCCL in collectives_gpu.cmake), Work, bootstrap and the
# TCP store. (TimedCommunicator moved to parallel/overlap/: overlap.cmake.)
quintet_mpi_test(NAME collectives_ops_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_ops_test.cpp)
quintet_mpi_test(NAME collectives_validation_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_validation_test.cpp)
quintet_mpi_test(NAME collectives_split_test COMPONENT collectives RANKS 1 2 3 4 8
                 SOURCES mpi/collectives_split_test.cpp)
quintet_unit_test(NAME collectives_bootstrap_test COMPONENT collectives
                  SOURCES unit/collectives_bootstrap_test.cpp)
quintet_unit_test(NAME collectives_tcp_store_test COMPONENT collectives
                  SOURCES unit/collectives_tcp_store_test.cpp)
# The store is a private class of the collectives layer: the test gets that layer's include root.
target_link_libraries(collectives_tcp_store_test PRIVATE quintet_collectives_private)
# The MPI backend's progress thread (a private class of the collectives layer, like the store).
quintet_unit_test(NAME collectives_progress_thread_test COMPONENT collectives
                  SOURCES unit/collectives_progress_thread_test.cpp)
target_link_libraries(collectives_progress_thread_test PRIVATE quintet_collectives_private)
# The communicators' watchdog (a held-back operation nobody waits for; issue #44), private.
quintet_unit_test(NAME collectives_watchdog_test COMPONENT reliability
                  SOURCES unit/collectives_watchdog_test.cpp)
target_link_libraries(collectives_watchdog_test PRIVATE quintet_collectives_private)
# The flight recorder's ring and its dumps (issue #44).
quintet_unit_test(NAME collectives_flight_recorder_test COMPONENT reliability
                  SOURCES unit/collectives_flight_recorder_test.cpp)
target_link_libraries(collectives_flight_recorder_test PRIVATE quintet_collectives_private
                                                               nlohmann_json::nlohmann_json)
# Naming the rank that is behind from the ranks' progress reports, the part the MPI and NCCL
# backends share (issue #44).
quintet_unit_test(NAME collectives_laggard_test COMPONENT reliability
                  SOURCES unit/collectives_laggard_test.cpp)
target_link_libraries(collectives_laggard_test PRIVATE quintet_collectives_private)
# Splits that name their members: refused when wrong, passed on by wrappers and by the Mesh, and
# mapped to the world ranks an NCCL split records in the flight recorder (issue #44).
quintet_unit_test(NAME collectives_split_members_test COMPONENT reliability
                  SOURCES unit/collectives_split_members_test.cpp)
target_link_libraries(collectives_split_members_test PRIVATE quintet_collectives_private)
# The members of an NCCL split made without them, gathered over MPI (issue #44).
quintet_mpi_test(NAME collectives_split_exchange_test COMPONENT reliability RANKS 1 3
                 SOURCES mpi/collectives_split_exchange_test.cpp)
target_link_libraries(collectives_split_exchange_test PRIVATE quintet_collectives_private)
# The start-up check that every rank runs with the same settings.
quintet_mpi_test(NAME collectives_consistency_test COMPONENT collectives RANKS 1 2 3
                 SOURCES mpi/collectives_consistency_test.cpp)
# Placement at start-up (--cpu-affinity auto|none): the threads' CPUs, read back from /proc.
quintet_mpi_test(NAME collectives_placement_test COMPONENT collectives RANKS 1 2 3
                 SOURCES mpi/collectives_placement_test.cpp)

# The MPI backend under ThreadSanitizer and AddressSanitizer: its progress thread, flight
# recorder, operations, splits, validation, the job monitor's failure paths and the collective
# check at 2 and 3 ranks (scripts/sanitize.sh says which tests), in the sanitizer build dirs the
# data tests use (data.cmake), one suite at a time. Not registered inside a sanitizer build.
if(NOT QUINTET_SANITIZE)
  foreach(kind thread address)
    add_test(NAME collectives_sanitize_${kind}
             COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/sanitize.sh ${kind}
                     ${PROJECT_BINARY_DIR}/sanitize-${kind} collectives)
    set_tests_properties(collectives_sanitize_${kind} PROPERTIES
                         LABELS "mpi;collectives;reliability" TIMEOUT 3000
                         RESOURCE_LOCK sanitize-${kind})
  endforeach()
endif()
