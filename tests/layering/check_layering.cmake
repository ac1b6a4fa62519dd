# Checks that the layers of the library (cmake/QuintetLayers.cmake) stay apart. Run with cmake -P by
# the layering_* tests of tests/cmake/layering.cmake; fails listing every violation of:
#   1. private headers: with the include path a layer is compiled with, the private headers of
#      its own folder resolve under the layer's name ("core/internal/tensor_kernels.hpp" from
#      core) and no other layer's private header resolves under any spelling (the layer's name,
#      the path from the repository root, the path inside the layer's folder). Probed with
#      __has_include in one preprocessor run per layer, so headers that this configuration does
#      not compile (nccl/ without NCCL) are probed too;
#   2. no escape by relative path: an #include "..." that resolves next to the including file
#      stays inside that file's layer;
#   3. dependencies point one way: a layer's sources and its public headers
#      (include/quintet/<layer>/) include public headers of that layer and the layers below it
#      only, and no "<other layer>/..." private header by name.
# Inputs (-D): CXX (the C++ compiler), SOURCE_DIR, WORK_DIR, LAYERS (names separated by |), and per
# layer LAYER_<name>_DIR (folder from SOURCE_DIR), LAYER_<name>_ALLOWED and LAYER_<name>_INCLUDES
# (| separated). EXTRA_INCLUDES_<name> adds include folders to one layer's probe: the
# layering_check_can_fail test uses it to prove that a leak is reported.
cmake_minimum_required(VERSION 3.24)

foreach(var CXX SOURCE_DIR WORK_DIR LAYERS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_layering.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" layers "${LAYERS}")
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(violations "")
set(header_globs *.hpp *.h *.cuh)

# Every spelling of every layer's private headers; own_<layer> lists the legal ones.
set(spellings "")
foreach(layer IN LISTS layers)
  set(dir ${SOURCE_DIR}/${LAYER_${layer}_DIR})
  if(NOT IS_DIRECTORY ${dir})
    message(FATAL_ERROR "layer ${layer}: folder ${dir} does not exist")
  endif()
  list(TRANSFORM header_globs PREPEND ${dir}/ OUTPUT_VARIABLE globs)
  file(GLOB_RECURSE headers RELATIVE ${dir} ${globs})
  set(own_${layer} "")
  foreach(h IN LISTS headers)
    list(APPEND own_${layer} "${layer}/${h}")
    list(APPEND spellings "${layer}/${h}" "${LAYER_${layer}_DIR}/${h}" "${h}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES spellings)

# 1. What the include path of each layer resolves.
set(probe_source "")
foreach(s IN LISTS spellings)
  string(APPEND probe_source "#if __has_include(\"${s}\")\nquintet_visible \"${s}\"\n#endif\n")
endforeach()
set(probed 0)
foreach(layer IN LISTS layers)
  set(probe_dir ${WORK_DIR}/${layer})  # empty: nothing resolves next to the probe itself
  file(MAKE_DIRECTORY ${probe_dir})
  file(WRITE ${probe_dir}/probe.cpp "${probe_source}")
  string(REPLACE "|" ";" includes "${LAYER_${layer}_INCLUDES};${EXTRA_INCLUDES_${layer}}")
  set(flags "")
  foreach(i IN LISTS includes)
    if(i)
      list(APPEND flags "-I${i}")
    endif()
  endforeach()
  execute_process(COMMAND ${CXX} -std=c++20 -E -P ${flags} ${probe_dir}/probe.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "layer ${layer}: preprocessing the probe failed (${rc}):\n${err}")
  endif()
  string(REGEX MATCHALL "quintet_visible \"[^\"]*\"" lines "${out}")
  set(visible "")
  foreach(l IN LISTS lines)
    string(REGEX REPLACE "quintet_visible \"([^\"]*)\"" "\\1" name "${l}")
    list(APPEND visible "${name}")
  endforeach()
  list(REMOVE_DUPLICATES includes)
  list(JOIN includes " " shown)
  foreach(name IN LISTS visible)
    if(NOT name IN_LIST own_${layer})
      list(APPEND violations
           "${layer} can include another layer's private header \"${name}\" (include path: ${shown})")
    endif()
  endforeach()
  foreach(name IN LISTS own_${layer})
    if(NOT name IN_LIST visible)
      list(APPEND violations "${layer} cannot include its own private header \"${name}\"")
    endif()
    math(EXPR probed "${probed} + 1")
  endforeach()
endforeach()

# 2 and 3: the include lines of each layer's files.
set(scanned 0)
foreach(layer IN LISTS layers)
  set(dir ${SOURCE_DIR}/${LAYER_${layer}_DIR})
  string(REPLACE "|" ";" allowed "${LAYER_${layer}_ALLOWED}")
  list(JOIN allowed ", " allowed_shown)
  list(TRANSFORM header_globs PREPEND ${dir}/ OUTPUT_VARIABLE globs)
  file(GLOB_RECURSE files ${globs} ${dir}/*.cpp ${dir}/*.cu
                          ${SOURCE_DIR}/include/quintet/${layer}/*.hpp)
  foreach(f IN LISTS files)
    math(EXPR scanned "${scanned} + 1")
    file(RELATIVE_PATH where ${SOURCE_DIR} ${f})
    file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    foreach(l IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*)[>\"].*" "\\1" inc "${l}")
      get_filename_component(dir_of_f ${f} DIRECTORY)
      if(l MATCHES "\"" AND EXISTS ${dir_of_f}/${inc})
        get_filename_component(target ${dir_of_f}/${inc} REALPATH)
        get_filename_component(real_dir ${dir} REALPATH)
        string(FIND "${target}" "${real_dir}/" at)
        if(NOT at EQUAL 0)
          list(APPEND violations "${where}: #include \"${inc}\" leaves layer ${layer} by a relative path")
        endif()
      endif()
      if(inc MATCHES "^quintet/([a-z_]+)/")
        set(to ${CMAKE_MATCH_1})
        if(to IN_LIST layers AND NOT to IN_LIST allowed)
          list(APPEND violations
               "${where}: layer ${layer} includes <${inc}> of layer ${to}, which is not below it (${layer} may use: ${allowed_shown})")
        endif()
      elseif(inc MATCHES "^([a-z_]+)/")
        set(to ${CMAKE_MATCH_1})
        if(to IN_LIST layers AND NOT to STREQUAL layer)
          list(APPEND violations "${where}: layer ${layer} includes \"${inc}\", a private header of layer ${to}")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

list(LENGTH layers n_layers)
if(violations)
  list(LENGTH violations n)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layering: ${n} violation(s):\n  ${text}\n"
          "A header that several layers need belongs under include/quintet/ (public); a layer's "
          "private header is included only from its own folder (see cmake/QuintetLayers.cmake).")
endif()
message(STATUS "layering: ${n_layers} layers apart; ${probed} private headers probed, ${scanned} files scanned")
