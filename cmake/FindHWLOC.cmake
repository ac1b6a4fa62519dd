# Finds hwloc 2 (optional: the machine's topology, core/topology.hpp). Looks in HWLOC_ROOT and the
# system paths (Debian's libhwloc-dev). Defines HWLOC_FOUND and the target HWLOC::hwloc.
set(_hwloc_hints ${HWLOC_ROOT} $ENV{HWLOC_ROOT})
find_path(HWLOC_INCLUDE_DIR hwloc.h HINTS ${_hwloc_hints} PATH_SUFFIXES include)
find_library(HWLOC_LIBRARY NAMES hwloc HINTS ${_hwloc_hints} PATH_SUFFIXES lib lib64)
# hwloc 1.x has another API (NUMA nodes in the tree, no I/O type filters): its API version is
# 0x0001xxxx.
set(_hwloc_api_2 FALSE)
if(HWLOC_INCLUDE_DIR)
  file(STRINGS ${HWLOC_INCLUDE_DIR}/hwloc.h _hwloc_api REGEX "^#define HWLOC_API_VERSION 0x")
  if(_hwloc_api MATCHES "0x0*([0-9a-fA-F]+)0[0-9a-fA-F]00" AND NOT CMAKE_MATCH_1 STREQUAL "1")
    set(_hwloc_api_2 TRUE)
  endif()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(HWLOC REQUIRED_VARS HWLOC_LIBRARY HWLOC_INCLUDE_DIR _hwloc_api_2)
if(HWLOC_FOUND AND NOT TARGET HWLOC::hwloc)
  add_library(HWLOC::hwloc UNKNOWN IMPORTED)
  set_target_properties(HWLOC::hwloc PROPERTIES IMPORTED_LOCATION ${HWLOC_LIBRARY}
                                                INTERFACE_INCLUDE_DIRECTORIES ${HWLOC_INCLUDE_DIR})
endif()
mark_as_advanced(HWLOC_INCLUDE_DIR HWLOC_LIBRARY)
