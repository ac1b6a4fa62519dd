# Installs the built Quintet into WORK_DIR/prefix, then configures, builds and runs the
# downstream project of tests/install/project against it, as a CPU-only consumer: CUDA and NCCL
# are hidden from find_package, so a package that needed them at configure time fails here.
# docs/trainer.md's program is extracted from the page (its first ```cpp block) and built too
# (trainer_test.sh trains it). With HAS_NCCL, a second configure asks for the nccl component and
# builds a program that calls NCCL. Run with cmake -P.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)

# The tools installed beside the library run from the installed tree (their RUNPATH finds the
# installed libquintet): 12_checkpoint_tool --help prints its usage, 02_layout a layout.
if(HAS_TOOLS)
  foreach(check "12_checkpoint_tool;--help;Usage: .*DIR.*--verify"
                "02_layout;--world;4;--tp;2;world 4: tp 2, cp 1")
    list(POP_BACK check expected)
    list(POP_FRONT check tool)
    execute_process(COMMAND ${WORK_DIR}/prefix/bin/${tool} ${check} RESULT_VARIABLE rc
                    OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT "${out}" MATCHES "${expected}")
      message(FATAL_ERROR "installed bin/${tool} ${check}: exit ${rc}, output\n${out}${err}\n"
                          "expected exit 0 and output matching '${expected}'")
    endif()
    message("installed bin/${tool} ${check}: as expected")
  endforeach()
endif()

file(READ ${SOURCE_DIR}/docs/trainer.md page)
string(FIND "${page}" "```cpp\n" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "docs/trainer.md has no ```cpp block")
endif()
math(EXPR begin "${begin} + 7")
string(SUBSTRING "${page}" ${begin} -1 rest)
string(FIND "${rest}" "```" end)
string(SUBSTRING "${rest}" 0 ${end} program)
file(WRITE ${WORK_DIR}/trainer.cpp "${program}")

run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/project -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
    -DTRAINER_SOURCE=${WORK_DIR}/trainer.cpp
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/downstream)

if(HAS_NCCL)
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/project -B ${WORK_DIR}/build_nccl
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
      -DQUINTET_DOWNSTREAM_NCCL=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build_nccl -j 2 --target nccl_user)
  run(${WORK_DIR}/build_nccl/nccl_user)
endif()
