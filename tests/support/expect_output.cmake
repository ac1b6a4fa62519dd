# Runs a command and passes only when both its exit status and its output are as expected (ctest's
# PASS_REGULAR_EXPRESSION alone ignores the exit status). Run with cmake -P by the tests that
# quintet_output_test (tests/CMakeLists.txt) adds:
#   cmake "-DMATCH=<regex>" [-DFAILS=ON] -P expect_output.cmake -- <command> [args...]
# MATCH: a regular expression the command's stdout and stderr together must match.
# FAILS: the command must exit with a non-zero status (not a signal); else with status 0.
set(_command "")
set(_after_separator OFF)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE ${_last})
  if(_after_separator)
    list(APPEND _command "${CMAKE_ARGV${_i}}")
  elseif(CMAKE_ARGV${_i} STREQUAL "--")
    set(_after_separator ON)
  endif()
endforeach()
if(NOT _command OR NOT DEFINED MATCH OR MATCH STREQUAL "")
  message(FATAL_ERROR "usage: cmake -DMATCH=<regex> [-DFAILS=ON] -P expect_output.cmake -- "
                      "<command> [args...]")
endif()

execute_process(COMMAND ${_command} RESULT_VARIABLE _status OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err)
message("${_out}${_err}")
list(JOIN _command " " _shown)
if(FAILS)
  if(NOT _status MATCHES "^[1-9][0-9]*$")
    message(FATAL_ERROR "expected a non-zero exit status from ${_shown}, got '${_status}'")
  endif()
elseif(NOT _status STREQUAL "0")
  message(FATAL_ERROR "${_shown} exited with '${_status}', expected 0")
endif()
if(NOT "${_out}${_err}" MATCHES "${MATCH}")
  message(FATAL_ERROR "the output of ${_shown} does not match '${MATCH}'")
endif()
message("expect_output: exit status ${_status} and the output as expected")
