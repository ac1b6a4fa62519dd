# The layers of the library, one OBJECT library each, linked into the one shared library
# `quintet`. Dependencies point one way (docs/architecture.md section 1):
#
#   core  <-  nn, data, collectives  <-  parallel
#
# Every layer sees the public headers (include/, through quintet_api) and, privately, its own
# source folder only, reached under the layer's name: core's sources write
# #include "core/internal/tensor_kernels.hpp", parallel's "parallel/tensor_parallel/internal/regions.hpp".
# The include root of a layer is a folder of the build tree holding one symbolic link,
#   <build>/layers/<layer>/<layer> -> <source folder of the layer>
# so the source tree itself (where every layer's folder lies side by side) is never on an include
# path, and "core/internal/..." does not resolve from nn: the build fails. tests/layering checks
# that it stays so.
#
#   quintet_add_layer(<name> SOURCE_DIR <folder> [DEPENDS <layers below>])
# gathers <folder>/**/*.cpp and *.cu (CONFIGURE_DEPENDS: a new file or subfolder is picked up by
# the next build); a folder named cuda/ (and every .cu file) is built only with CUDA, nccl/ only
# with NCCL, cudnn/ only with cuDNN. It makes quintet_<name> (the objects) and
# quintet_<name>_private (an INTERFACE target with the layer's private include root, for white-box
# tests of that layer only).

# What the public headers need: their folder, the generated config.hpp, C++20 and the libraries
# they name in their interface. Linked PUBLIC by quintet, hence installed with it. CUDA and NCCL
# are not among them (no public header includes theirs, bar the opt-in nccl.hpp): the shared
# library links them privately, so a CPU-only program builds against a CUDA build of Quintet
# without the CUDA toolkit (cmake/quintetConfig.cmake.in).
add_library(quintet_api INTERFACE)
set_target_properties(quintet_api PROPERTIES EXPORT_NAME api)
target_include_directories(quintet_api
  INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
            $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(quintet_api INTERFACE cxx_std_20)
target_link_libraries(quintet_api INTERFACE MPI::MPI_CXX fmt::fmt Threads::Threads)

# What the library's own sources (and its white-box tests) see of CUDA and NCCL.
add_library(quintet_device_libs INTERFACE)
if(QUINTET_HAS_CUDA)
  target_link_libraries(quintet_device_libs INTERFACE CUDA::cudart)
endif()
if(QUINTET_HAS_NCCL)
  target_link_libraries(quintet_device_libs INTERFACE NCCL::NCCL)
endif()

function(quintet_add_layer name)
  cmake_parse_arguments(L "" "SOURCE_DIR" "DEPENDS" ${ARGN})
  set(dir ${PROJECT_SOURCE_DIR}/${L_SOURCE_DIR})
  file(GLOB_RECURSE sources RELATIVE ${dir} CONFIGURE_DEPENDS ${dir}/*.cpp ${dir}/*.cu)
  if(NOT QUINTET_HAS_CUDA)
    list(FILTER sources EXCLUDE REGEX "(^|/)cuda/|\\.cu$")
  endif()
  if(NOT QUINTET_HAS_NCCL)
    list(FILTER sources EXCLUDE REGEX "(^|/)nccl/")
  endif()
  if(NOT QUINTET_HAS_CUDNN)
    list(FILTER sources EXCLUDE REGEX "(^|/)cudnn/")
  endif()
  # *_sm90a.cu: code for the arch-specific sm_90a target (wgmma), an object library of its own
  # built for 90a only, so that the layer's other sources keep the project's architectures.
  set(sm90a_sources ${sources})
  list(FILTER sm90a_sources INCLUDE REGEX "_sm90a\\.cu$")
  list(FILTER sources EXCLUDE REGEX "_sm90a\\.cu$")
  list(TRANSFORM sources PREPEND ${dir}/)
  list(TRANSFORM sm90a_sources PREPEND ${dir}/)

  set(root ${PROJECT_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${root})
  file(CREATE_LINK ${dir} ${root}/${name} SYMBOLIC)

  add_library(quintet_${name} OBJECT ${sources})
  target_include_directories(quintet_${name} PRIVATE ${root})
  target_link_libraries(quintet_${name} PUBLIC quintet_api PRIVATE quintet_device_libs)
  foreach(dep IN LISTS L_DEPENDS)
    target_link_libraries(quintet_${name} PUBLIC quintet_${dep})
  endforeach()
  target_compile_options(quintet_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  if(QUINTET_HAS_CUDA)
    set_target_properties(quintet_${name} PROPERTIES CUDA_STANDARD 17
                                                     CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(quintet_${name}
                           PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  endif()

  if(sm90a_sources)
    add_library(quintet_${name}_sm90a OBJECT ${sm90a_sources})
    target_include_directories(quintet_${name}_sm90a PRIVATE ${root})
    target_link_libraries(quintet_${name}_sm90a PRIVATE quintet_${name} quintet_device_libs)
    set_target_properties(quintet_${name}_sm90a PROPERTIES CUDA_ARCHITECTURES 90a CUDA_STANDARD 17
                                                           CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(quintet_${name}_sm90a PRIVATE --expt-relaxed-constexpr)
    set_property(GLOBAL APPEND PROPERTY QUINTET_LAYER_EXTRA_OBJECTS quintet_${name}_sm90a)
  endif()

  add_library(quintet_${name}_private INTERFACE)
  target_include_directories(quintet_${name}_private INTERFACE ${root})
  target_link_libraries(quintet_${name}_private INTERFACE quintet_device_libs)

  # For tests/layering: the layer's folder and the layers whose public headers it may include
  # (itself and everything below it).
  set(allowed ${name})
  foreach(dep IN LISTS L_DEPENDS)
    get_property(below GLOBAL PROPERTY QUINTET_LAYER_${dep}_ALLOWED)
    list(APPEND allowed ${below})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL APPEND PROPERTY QUINTET_LAYERS ${name})
  set_property(GLOBAL PROPERTY QUINTET_LAYER_${name}_DIR ${L_SOURCE_DIR})
  set_property(GLOBAL PROPERTY QUINTET_LAYER_${name}_ALLOWED ${allowed})
endfunction()

quintet_add_layer(core SOURCE_DIR lib/core)
quintet_add_layer(nn SOURCE_DIR lib/nn DEPENDS core)
quintet_add_layer(data SOURCE_DIR lib/data DEPENDS core)
quintet_add_layer(collectives SOURCE_DIR collectives DEPENDS core)
quintet_add_layer(parallel SOURCE_DIR parallel DEPENDS nn data collectives)

# What one layer needs beyond the others.
if(QUINTET_HAS_CUDA)
  # core: bitwise CPU == GPU random numbers need IEEE arithmetic without contraction into FMA.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/lib/core/cuda/tensor_kernels.cu
                              PROPERTIES COMPILE_OPTIONS "--fmad=false")
endif()
target_link_libraries(quintet_nn PRIVATE Eigen3::Eigen)
# core: the machine's topology (lib/core/topology_hwloc.cpp), when hwloc is found.
if(QUINTET_HAS_HWLOC)
  target_link_libraries(quintet_core PRIVATE HWLOC::hwloc)
endif()
# parallel: the job config's flags and job file (train::JobConfig), header-only.
target_link_libraries(quintet_parallel PRIVATE CLI11::CLI11 nlohmann_json::nlohmann_json)
# collectives: the flight recorder's dumps (flight_recorder.cpp), header-only.
target_link_libraries(quintet_collectives PRIVATE nlohmann_json::nlohmann_json)
# data: the headers and indexes of safetensors files (safetensors*.cpp), header-only.
target_link_libraries(quintet_data PRIVATE nlohmann_json::nlohmann_json)
if(QUINTET_HAS_CUDA)
  target_link_libraries(quintet_nn PRIVATE CUDA::cublasLt CUDA::cublas)
endif()
if(QUINTET_HAS_CUDNN)
  target_link_libraries(quintet_nn PRIVATE CUDNN::CUDNN)
endif()

# The one library users link: every layer's objects, the public interface of quintet_api.
add_library(quintet SHARED)
add_library(quintet::quintet ALIAS quintet)
set_target_properties(quintet PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                                         LINKER_LANGUAGE CXX)
target_link_libraries(quintet PUBLIC quintet_api PRIVATE quintet_device_libs)
# Installed, the library finds the CUDA and NCCL it was linked with (outside the system paths).
set_target_properties(quintet PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

# quintet::nccl: for programs that call NCCL or the CUDA runtime on Quintet's tensors themselves
# (quintet/collectives/nccl.hpp: a benchmark's raw baseline, a custom kernel's communication).
if(QUINTET_HAS_NCCL)
  add_library(quintet_nccl INTERFACE)
  add_library(quintet::nccl ALIAS quintet_nccl)
  set_target_properties(quintet_nccl PROPERTIES EXPORT_NAME nccl)
  target_link_libraries(quintet_nccl INTERFACE quintet NCCL::NCCL CUDA::cudart)
endif()
get_property(_quintet_layers GLOBAL PROPERTY QUINTET_LAYERS)
foreach(layer IN LISTS _quintet_layers)
  target_link_libraries(quintet PRIVATE quintet_${layer})
endforeach()
get_property(_quintet_extra_objects GLOBAL PROPERTY QUINTET_LAYER_EXTRA_OBJECTS)
foreach(objects IN LISTS _quintet_extra_objects)
  target_link_libraries(quintet PRIVATE ${objects})
endforeach()
