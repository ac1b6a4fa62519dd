# Collectives on GPUs: the NCCL communicator, one GPU per rank (exit 77 = skipped without enough
# GPUs). The tests call the NCCL backend's private entry points (collectives/nccl/nccl_backend.hpp),
# hence the collectives layer's private include root.
if(QUINTET_HAS_NCCL)
  foreach(_test collectives_nccl_test collectives_nccl_semantics_test)
    quintet_gpu_test(NAME gpu_${_test} COMPONENT collectives RANKS 1 2 SOURCES gpu/${_test}.cpp)
    target_link_libraries(gpu_${_test} PRIVATE quintet_collectives_private quintet::nccl
                                               nlohmann_json::nlohmann_json)
  endforeach()
  # Its options, checked before any communication: a unit test, run on any machine.
  quintet_unit_test(NAME collectives_nccl_options_test COMPONENT collectives
                    SOURCES unit/collectives_nccl_options_test.cpp)
  target_link_libraries(collectives_nccl_options_test PRIVATE quintet_collectives_private
                                                              quintet::nccl)
endif()
