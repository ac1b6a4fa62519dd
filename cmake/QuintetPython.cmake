# Decides whether the Python module quintet_data (python/) is built: QUINTET_HAS_PYTHON.
#
# It needs a Python 3 interpreter that imports NumPy (the module hands batches out as NumPy
# arrays), that interpreter's headers, and pybind11 (Debian's pybind11-dev, or the pybind11 pip
# package of that interpreter). Without Python3_EXECUTABLE, the first of `python3` on PATH and
# /usr/bin/python3 that imports NumPy is used: a pyenv or venv python3 first on PATH may lack
# NumPy while the system one has it. AUTO skips the module, saying what is missing; ON fails.
set(QUINTET_BUILD_PYTHON AUTO CACHE STRING
    "Build the Python module quintet_data: AUTO (when Python 3 with NumPy, its headers and pybind11 are found), ON or OFF")
set_property(CACHE QUINTET_BUILD_PYTHON PROPERTY STRINGS AUTO ON OFF)

set(QUINTET_HAS_PYTHON OFF)
function(_quintet_python_missing what)
  if(QUINTET_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "QUINTET_BUILD_PYTHON=ON but ${what}")
  endif()
  message(STATUS "Quintet: the Python module quintet_data is skipped: ${what}")
endfunction()

if(NOT QUINTET_BUILD_PYTHON STREQUAL "OFF")
  if(NOT Python3_EXECUTABLE)
    find_program(_quintet_path_python3 NAMES python3)
    foreach(candidate IN ITEMS "${_quintet_path_python3}" /usr/bin/python3)
      if(candidate AND EXISTS "${candidate}")
        execute_process(COMMAND "${candidate}" -c "import numpy" RESULT_VARIABLE rc
                        OUTPUT_QUIET ERROR_QUIET)
        if(rc EQUAL 0)
          set(Python3_EXECUTABLE "${candidate}" CACHE FILEPATH "Python for quintet_data")
          break()
        endif()
      endif()
    endforeach()
  endif()
  if(NOT Python3_EXECUTABLE)
    _quintet_python_missing("no python3 that imports numpy (apt-get install python3-numpy)")
  else()
    find_package(Python3 COMPONENTS Interpreter Development.Module)
    if(NOT Python3_Development.Module_FOUND)
      _quintet_python_missing("no headers for ${Python3_EXECUTABLE} (apt-get install python3-dev)")
    else()
      find_package(pybind11 CONFIG QUIET)
      if(NOT pybind11_FOUND)
        execute_process(COMMAND "${Python3_EXECUTABLE}" -m pybind11 --cmakedir
                        OUTPUT_VARIABLE _quintet_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE rc ERROR_QUIET)
        if(rc EQUAL 0)
          find_package(pybind11 CONFIG QUIET PATHS "${_quintet_pybind11_dir}" NO_DEFAULT_PATH)
        endif()
      endif()
      if(NOT pybind11_FOUND)
        _quintet_python_missing("pybind11 not found (apt-get install pybind11-dev)")
      else()
        set(QUINTET_HAS_PYTHON ON)
        message(STATUS "Quintet: the Python module quintet_data for ${Python3_EXECUTABLE} "
                       "(Python ${Python3_VERSION}, pybind11 ${pybind11_VERSION})")
      endif()
    endif()
  endif()
endif()
