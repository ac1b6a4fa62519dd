# Core: errors, dtypes, devices, tensors, streams, allocators, random numbers, runtime config.
quintet_unit_test(NAME core_error_test COMPONENT core SOURCES unit/core_error_test.cpp)
quintet_unit_test(NAME core_dtype_test COMPONENT core SOURCES unit/core_dtype_test.cpp)
quintet_unit_test(NAME core_tensor_test COMPONENT core SOURCES unit/core_tensor_test.cpp)
quintet_unit_test(NAME core_random_test COMPONENT core SOURCES unit/core_random_test.cpp)
quintet_unit_test(NAME core_runtime_config_test COMPONENT core
                  SOURCES unit/core_runtime_config_test.cpp)
quintet_gpu_test(NAME gpu_core_allocator_test COMPONENT core SOURCES gpu/core_allocator_test.cpp)
# (cudaPointerGetAttributes: whether pinned host tensors are page-locked.)
target_link_libraries(gpu_core_allocator_test PRIVATE quintet_device_libs)
quintet_gpu_test(NAME gpu_core_tensor_test COMPONENT core SOURCES gpu/core_tensor_test.cpp)

# The downstream project of tests/install: install Quintet into a fresh tree, then configure
# (as a CPU-only consumer), build and run programs that use find_package(quintet), docs/trainer.md's
# among them (trained by install_trainer, examples/04_gpt_train/CMakeLists.txt); the installed
# tools (bin/02_layout, bin/12_checkpoint_tool) run from the tree.
set(QUINTET_INSTALL_TEST_DIR ${CMAKE_CURRENT_BINARY_DIR}/install_test CACHE INTERNAL "")
set(_has_tools OFF)
if(QUINTET_BUILD_EXAMPLES AND TARGET CLI11::CLI11 AND TARGET nlohmann_json::nlohmann_json)
  set(_has_tools ON)
endif()
add_test(NAME install_find_package
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DBUILD_DIR=${PROJECT_BINARY_DIR}
                 -DWORK_DIR=${QUINTET_INSTALL_TEST_DIR} -DHAS_NCCL=${QUINTET_HAS_NCCL}
                 -DHAS_TOOLS=${_has_tools}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/install/run_install_test.cmake)
set_tests_properties(install_find_package PROPERTIES LABELS "unit;core" TIMEOUT 900
                     FIXTURES_SETUP quintet_install_tree)

# Topology and placement: CPU lists, the placement plan and the report on made-up facts, a made-up
# two-NUMA machine from hwloc XML (unit/data/topology_two_numa.xml).
quintet_unit_test(NAME core_topology_test COMPONENT core SOURCES unit/core_topology_test.cpp)
target_compile_definitions(core_topology_test PRIVATE
                           QUINTET_TOPOLOGY_XML="${CMAKE_CURRENT_SOURCE_DIR}/unit/data/topology_two_numa.xml")
# The GPU's PCI bus id, NUMA node and local CPUs (checked against sysfs), and its report line.
quintet_gpu_test(NAME gpu_core_topology_test COMPONENT core SOURCES gpu/core_topology_test.cpp)
