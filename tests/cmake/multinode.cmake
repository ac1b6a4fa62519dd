# Multi-node: a real mpirun --hostfile job over test hosts made of network namespaces
# (scripts/netns_cluster.sh), driven by tests/multinode/multinode_test.sh. Needs root and iproute2;
# skipped (77) where namespaces cannot be made. The namespaces and the subnet are global to the
# machine, so the test holds a resource lock (and the driver a file lock against other trees).

# whoami: each rank's host, address, local rank and local size as quintet::init sees them.
add_executable(multinode_whoami multinode/whoami.cpp)
target_link_libraries(multinode_whoami PRIVATE quintet::quintet)

# The examples are added after the tests: their targets are looked up at generate time.
if(QUINTET_BUILD_EXAMPLES)
  add_test(NAME multinode_netns_2x2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode/multinode_test.sh
                   --cluster ${PROJECT_SOURCE_DIR}/scripts/netns_cluster.sh
                   --whoami $<TARGET_FILE:multinode_whoami>
                   --bench "$<$<TARGET_EXISTS:01_collective_bench>:$<TARGET_FILE:01_collective_bench>>"
                   --gpt-train "$<$<TARGET_EXISTS:04_gpt_train>:$<TARGET_FILE:04_gpt_train>>"
                   --hosts 2 --slots 2)
  set_tests_properties(multinode_netns_2x2 PROPERTIES LABELS "mpi;collectives" TIMEOUT 900
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK quintet_netns PROCESSORS 2)
endif()
