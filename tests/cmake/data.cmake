# Data: token file formats, sampler, synthetic dataset, loader (CPU, MPI and GPU), sanitizers.
quintet_unit_test(NAME data_format_test COMPONENT data SOURCES unit/data_format_test.cpp)
quintet_unit_test(NAME data_sampler_test COMPONENT data SOURCES unit/data_sampler_test.cpp)
quintet_unit_test(NAME data_loader_test COMPONENT data SOURCES unit/data_loader_test.cpp)
quintet_unit_test(NAME data_synthetic_test COMPONENT data SOURCES unit/data_synthetic_test.cpp)
quintet_unit_test(NAME data_safetensors_test COMPONENT data SOURCES unit/data_safetensors_test.cpp)
quintet_mpi_test(NAME data_sampler_mpi_test COMPONENT data RANKS 1 2 3 4
                 SOURCES mpi/data_sampler_mpi_test.cpp)
quintet_gpu_test(NAME gpu_data_loader_test COMPONENT data SOURCES gpu/data_loader_test.cpp)

# The loader under ThreadSanitizer and AddressSanitizer: a separate CPU-only build of libquintet
# and the data unit tests (scripts/sanitize.sh), incremental after its first run. Not registered
# inside that sanitizer build itself. The build dir is shared with the collectives' sanitizer
# tests (collectives.cmake), one at a time (RESOURCE_LOCK).
if(NOT QUINTET_SANITIZE)
  foreach(kind thread address)
    add_test(NAME data_sanitize_${kind}
             COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/sanitize.sh ${kind}
                     ${PROJECT_BINARY_DIR}/sanitize-${kind} data)
    set_tests_properties(data_sanitize_${kind} PROPERTIES LABELS "unit;data" TIMEOUT 3000
                         RESOURCE_LOCK sanitize-${kind})
  endforeach()
endif()
