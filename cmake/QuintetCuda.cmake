# Decides whether CUDA, NCCL and cuDNN are used and sets QUINTET_HAS_CUDA, QUINTET_HAS_NCCL and
# QUINTET_HAS_CUDNN. AUTO turns a part on when it is found; ON makes its absence an error.
set(QUINTET_HAS_CUDA OFF)
set(QUINTET_HAS_NCCL OFF)
set(QUINTET_HAS_CUDNN OFF)

if(NOT QUINTET_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CUDA sources are C++17: nvcc 13 with g++ 12 cannot compile fmt's C++20 constexpr code, so
    # headers that .cu files include (core/*) stay C++17-clean.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(QUINTET_HAS_CUDA ON)
  elseif(QUINTET_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "QUINTET_WITH_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "set CMAKE_CUDA_COMPILER or use -DQUINTET_WITH_CUDA=OFF")
  endif()
endif()

if(QUINTET_HAS_CUDA AND NOT QUINTET_WITH_NCCL STREQUAL "OFF")
  find_package(NCCL)
  if(NCCL_FOUND)
    set(QUINTET_HAS_NCCL ON)
  elseif(QUINTET_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "QUINTET_WITH_NCCL=ON but NCCL was not found; set NCCL_ROOT")
  endif()
endif()

if(QUINTET_HAS_CUDA AND NOT QUINTET_WITH_CUDNN STREQUAL "OFF")
  find_package(CUDNN)
  if(CUDNN_FOUND)
    set(QUINTET_HAS_CUDNN ON)
  elseif(QUINTET_WITH_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "QUINTET_WITH_CUDNN=ON but cuDNN was not found; set CUDNN_ROOT")
  endif()
endif()

message(STATUS "Quintet: CUDA=${QUINTET_HAS_CUDA} NCCL=${QUINTET_HAS_NCCL} cuDNN=${QUINTET_HAS_CUDNN}")
