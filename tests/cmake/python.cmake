# Python: the quintet_data module (python/) against the C++ loader, when the module is built
# (cmake/QuintetPython.cmake says why it is not). Plain asserts run by the script itself.
if(TARGET quintet_python)
  add_executable(python_dump_batches python/dump_batches.cpp)
  target_link_libraries(python_dump_batches PRIVATE quintet::quintet)
  add_test(NAME python_loader_test
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/python/loader_test.py)
  set_tests_properties(python_loader_test PROPERTIES
    LABELS "unit;python;data" TIMEOUT 300 RUN_SERIAL TRUE  # timing-sensitive: the GIL test
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;QUINTET_DUMP_BATCHES=$<TARGET_FILE:python_dump_batches>")
endif()

# safetensors: the C++ reader and writer (through tests/python/safetensors_tool) against a reader
# and writer made of Python's standard library alone, so it runs wherever python3 does.
find_program(QUINTET_TEST_PYTHON3 NAMES python3)
if(QUINTET_TEST_PYTHON3)
  add_executable(safetensors_tool python/safetensors_tool.cpp)
  target_link_libraries(safetensors_tool PRIVATE quintet::quintet)
  add_test(NAME data_safetensors_python_test
           COMMAND ${QUINTET_TEST_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/safetensors_test.py
                   $<TARGET_FILE:safetensors_tool>)
  set_tests_properties(data_safetensors_python_test PROPERTIES LABELS "unit;python;data"
                       TIMEOUT 120)
endif()
