# Collectives on GPUs: the NCCL communicator, one GPU per rank (exit 77 = skipped without enough
# GPUs). The tests call the NCCL backend's private entry points (collectives/nccl/nccl_backend.hpp),
# hence the repository root on their include path.
if(QUINTET_HAS_NCCL)
  foreach(_test collectives_nccl_test collectives_nccl_semantics_test)
    quintet_gpu_test(NAME gpu_${_test} COMPONENT collectives RANKS 1 2 SOURCES gpu/${_test}.cpp)
    target_include_directories(gpu_${_test} PRIVATE ${PROJECT_SOURCE_DIR})
  endforeach()
endif()
