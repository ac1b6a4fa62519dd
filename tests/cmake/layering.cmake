# Layering: each layer of the library (cmake/QuintetLayers.cmake) reaches its own private headers
# and no other layer's, relative includes stay inside a layer, and dependencies point one way
# (tests/layering/check_layering.cmake). One preprocessor run per layer: a second or two.
get_property(_layers GLOBAL PROPERTY QUINTET_LAYERS)
set(_layer_args "")
foreach(_layer IN LISTS _layers)
  get_property(_dir GLOBAL PROPERTY QUINTET_LAYER_${_layer}_DIR)
  get_property(_allowed GLOBAL PROPERTY QUINTET_LAYER_${_layer}_ALLOWED)
  string(REPLACE ";" "|" _allowed "${_allowed}")
  list(APPEND _layer_args -DLAYER_${_layer}_DIR=${_dir} -DLAYER_${_layer}_ALLOWED=${_allowed}
       "-DLAYER_${_layer}_INCLUDES=$<JOIN:$<TARGET_PROPERTY:quintet_${_layer},INCLUDE_DIRECTORIES>,|>")
endforeach()
string(REPLACE ";" "|" _layers "${_layers}")
set(_layering_command ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DLAYERS=${_layers} ${_layer_args})

add_test(NAME layering_check
         COMMAND ${_layering_command} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/layering_check
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_layering.cmake)
set_tests_properties(layering_check PROPERTIES LABELS "unit;layering" TIMEOUT 120)

# The check can fail: with lib/ (where core, nn and data lie side by side) on nn's include path,
# as the build had before the layers, it must report that nn reaches core's private headers.
add_test(NAME layering_check_can_fail
         COMMAND ${_layering_command} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/layering_check_can_fail
                 -DEXTRA_INCLUDES_nn=${PROJECT_SOURCE_DIR}/lib
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_layering.cmake)
set_tests_properties(layering_check_can_fail PROPERTIES LABELS "unit;layering" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "nn can include another layer's private header \"core/internal/")

# The umbrella header quintet.hpp includes every public header and nothing that is gone.
add_test(NAME umbrella_header_check
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_umbrella.cmake)
set_tests_properties(umbrella_header_check PROPERTIES LABELS "unit;layering" TIMEOUT 60)

# The pipeline schedules without knowing data parallelism: nothing under parallel/pipeline (its
# sources and public headers) includes a parallel/data_parallel header or names DataParallel, the
# distributed optimizer or ZeRO's parts; it talks to nn::GradientSync, and the end of a step
# (parallel/train/step.cpp) finishes the reductions.
set(_pipeline_check ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    "-DFORBIDDEN_INCLUDES=(^|/)parallel/data_parallel/"
    "-DFORBIDDEN_WORDS=DataParallel|DataParallelConfig|DistributedOptimizer|zero_stage|owned_grad|reduced_grad"
    "-DWHY=the pipeline must not know data parallelism (it talks to nn::GradientSync)")
add_test(NAME layering_pipeline_check
         COMMAND ${_pipeline_check} "-DFOLDERS=parallel/pipeline|include/quintet/parallel/pipeline"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_no_includes.cmake)
set_tests_properties(layering_pipeline_check PROPERTIES LABELS "unit;layering" TIMEOUT 60)
# The check can fail: parallel/train, which finishes the reductions, includes data_parallel.hpp.
add_test(NAME layering_pipeline_check_can_fail
         COMMAND ${_pipeline_check} "-DFOLDERS=parallel/train|include/quintet/parallel/train"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_no_includes.cmake)
set_tests_properties(layering_pipeline_check_can_fail PROPERTIES LABELS "unit;layering" TIMEOUT 60
  PASS_REGULAR_EXPRESSION "include/quintet/parallel/train/step.hpp includes quintet/parallel/data_parallel/data_parallel.hpp")
