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
  # scripts/bench/kernel_groups.py (the by-kernel profile of the benchmarks) on made-up CSVs.
  add_test(NAME bench_kernel_groups_python_test
           COMMAND ${QUINTET_TEST_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/kernel_groups_test.py)
  set_tests_properties(bench_kernel_groups_python_test PROPERTIES LABELS "unit;python" TIMEOUT 60)
  # scripts/bench/ours_vs_torch.py (ours against PyTorch in the benchmarks) on made-up logs.
  add_test(NAME bench_ours_vs_torch_python_test
           COMMAND ${QUINTET_TEST_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/ours_vs_torch_test.py)
  set_tests_properties(bench_ours_vs_torch_python_test PROPERTIES LABELS "unit;python" TIMEOUT 60)
  # scripts/bench/loss_compare.py (bf16 against FP8 in fp8_loss_curves.sh) on made-up logs.
  add_test(NAME bench_loss_compare_python_test
           COMMAND ${QUINTET_TEST_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/loss_compare_test.py)
  set_tests_properties(bench_loss_compare_python_test PROPERTIES LABELS "unit;python" TIMEOUT 60)
endif()

# Hugging Face import: tiny checkpoints in the Hub's layout and their loss, from a NumPy (float64)
# reference of the Llama / Qwen3 / Mixtral / Qwen3-MoE forward (python/hf_reference.py), loaded
# with --init-from-hf at several layouts (python/hf_import_tool) and compared; and malformed
# checkpoints refused. Needs a python3 with NumPy (a pyenv python3 first on PATH may lack it).
set(QUINTET_NUMPY_PYTHON3 "")
foreach(candidate IN ITEMS "${QUINTET_TEST_PYTHON3}" /usr/bin/python3)
  if(NOT QUINTET_NUMPY_PYTHON3 AND candidate AND EXISTS "${candidate}")
    execute_process(COMMAND "${candidate}" -c "import numpy" RESULT_VARIABLE rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(QUINTET_NUMPY_PYTHON3 "${candidate}")
    endif()
  endif()
endforeach()
add_executable(hf_import_tool python/hf_import_tool.cpp)
target_link_libraries(hf_import_tool PRIVATE quintet::quintet)
if(QUINTET_NUMPY_PYTHON3)
  foreach(case dense moe malformed)
    add_test(NAME train_hf_import_${case}
             COMMAND ${QUINTET_NUMPY_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/hf_import_test.py
                     ${case} $<TARGET_FILE:hf_import_tool> ${MPIEXEC_EXECUTABLE}
                     ${QUINTET_MPIRUN_FLAGS})
    set_tests_properties(train_hf_import_${case} PROPERTIES LABELS "mpi;python;train"
                         TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
    quintet_mpi_processors(4 train_hf_import_${case})
  endforeach()
  # Both trainers' --init-from-hf (examples/, built with them).
  if(QUINTET_BUILD_EXAMPLES AND TARGET CLI11::CLI11 AND TARGET nlohmann_json::nlohmann_json)
    add_test(NAME train_hf_import_trainers
             COMMAND ${QUINTET_NUMPY_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/hf_import_test.py
                     trainers $<TARGET_FILE:hf_import_tool> ${MPIEXEC_EXECUTABLE}
                     ${QUINTET_MPIRUN_FLAGS})
    set_tests_properties(train_hf_import_trainers PROPERTIES LABELS "mpi;python;train;example"
                         TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;QUINTET_GPT_TRAIN=$<TARGET_FILE:04_gpt_train>;QUINTET_MOE_TRAIN=$<TARGET_FILE:05_moe_train>")
    quintet_mpi_processors(4 train_hf_import_trainers)
  endif()
else()
  message(STATUS "Quintet tests: train_hf_import_* skipped (no python3 that imports numpy)")
endif()

# Hugging Face export: Llama, Qwen3, Mixtral and Qwen3-MoE models trained two steps at a parallel
# layout, exported by the trainers (--export-hf) and by 12_checkpoint_tool --to-hf (the same
# bytes), their names, shapes and config.json against transformers' (python/hf_export_test.py),
# bf16 against NumPy's rounding, export -> import at another layout -> export bit-exact
# (python/hf_export_tool), and bad inputs refused leaving nothing.
add_executable(hf_export_tool python/hf_export_tool.cpp)
target_link_libraries(hf_export_tool PRIVATE quintet::quintet)
if(QUINTET_NUMPY_PYTHON3 AND QUINTET_BUILD_EXAMPLES AND TARGET CLI11::CLI11
   AND TARGET nlohmann_json::nlohmann_json)
  add_test(NAME train_hf_export
           COMMAND ${QUINTET_NUMPY_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/python/hf_export_test.py
                   $<TARGET_FILE:04_gpt_train> $<TARGET_FILE:05_moe_train>
                   $<TARGET_FILE:12_checkpoint_tool> $<TARGET_FILE:hf_export_tool>
                   ${MPIEXEC_EXECUTABLE} ${QUINTET_MPIRUN_FLAGS})
  set_tests_properties(train_hf_export PROPERTIES LABELS "mpi;python;train;checkpoint"
                       TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  quintet_mpi_processors(2 train_hf_export)
endif()

# Hugging Face export loaded by transformers itself (python/hf_transformers_check.py): Llama,
# Qwen3, Mixtral and Qwen3-MoE models trained a few steps (on the GPU when there is one) and
# exported in f32 and bf16 (sharded, with the index), what vLLM-style consumers read (config.json's
# architectures and torch_dtype, the index), and transformers' loss on held-out windows against
# Quintet's within 1e-4. Needs torch and transformers (the GPU machine: scripts/device_check.sh);
# elsewhere it exits 77, skipped. train_hf_transformers_quintet runs all but transformers, cheaply,
# on one CPU rank.
if(QUINTET_BUILD_EXAMPLES AND TARGET CLI11::CLI11 AND TARGET nlohmann_json::nlohmann_json
   AND QUINTET_TEST_PYTHON3)
  set(QUINTET_TRANSFORMERS_PYTHON3 "${QUINTET_TEST_PYTHON3}")
  foreach(candidate IN ITEMS "${QUINTET_TEST_PYTHON3}" /usr/bin/python3)
    if(EXISTS "${candidate}")
      execute_process(COMMAND "${candidate}" -c "import torch, transformers"
                      RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(QUINTET_TRANSFORMERS_PYTHON3 "${candidate}")
        break()
      endif()
    endif()
  endforeach()
  set(_hf_check ${CMAKE_CURRENT_SOURCE_DIR}/python/hf_transformers_check.py
      $<TARGET_FILE:04_gpt_train> $<TARGET_FILE:05_moe_train> $<TARGET_FILE:12_checkpoint_tool>)
  add_test(NAME gpu_train_hf_transformers
           COMMAND ${QUINTET_TRANSFORMERS_PYTHON3} ${_hf_check} ${MPIEXEC_EXECUTABLE}
                   ${QUINTET_MPIRUN_FLAGS})
  set_tests_properties(gpu_train_hf_transformers PROPERTIES LABELS "gpu;python;train;example"
                       SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
  quintet_mpi_processors(2 gpu_train_hf_transformers)
  add_test(NAME train_hf_transformers_quintet
           COMMAND ${QUINTET_TEST_PYTHON3} ${_hf_check} --quintet-only)
  set_tests_properties(train_hf_transformers_quintet PROPERTIES
                       LABELS "python;train;example" TIMEOUT 120)
endif()
