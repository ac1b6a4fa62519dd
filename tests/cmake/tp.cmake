# Tensor and sequence parallelism: every layer against its unsharded nn layer under mpirun (tp =
# the whole job, odd sizes included), a transformer block trained under tp = 2 x dp = 2 against
# one rank, and on two GPUs tp = 2 against tp = 1 in bf16 (skipped without two GPUs).
quintet_mpi_test(NAME tp_layers_test COMPONENT tp RANKS 1 2 3 4 SOURCES mpi/tp_layers_test.cpp)
quintet_mpi_test(NAME tp_train_test COMPONENT tp RANKS 4 SOURCES mpi/tp_train_test.cpp)
quintet_mpi_test(NAME tp_gpt_test COMPONENT tp RANKS 2 3 4 SOURCES mpi/tp_gpt_test.cpp)
if(QUINTET_HAS_NCCL)
  quintet_gpu_test(NAME gpu_tp_gpt_test COMPONENT tp RANKS 2 SOURCES gpu/tp_gpt_test.cpp)
endif()
# Overlap chunks: the chunked layers against the unchunked ones (odd tp included).
quintet_mpi_test(NAME tp_overlap_test COMPONENT tp RANKS 1 2 3 4 SOURCES mpi/tp_overlap_test.cpp)
quintet_mpi_test(NAME tp_attention_variants_test COMPONENT tp RANKS 1 2 3 4 SOURCES mpi/tp_attention_variants_test.cpp)
quintet_mpi_test(NAME tp_fp8_test COMPONENT tp RANKS 1 2 3 SOURCES mpi/tp_fp8_test.cpp)
# FP8 tp linear layers on the GPU (cuBLASLt's FP8 GEMMs, scales on the device) against the CPU
# emulation (skipped without a GPU).
quintet_gpu_test(NAME gpu_tp_fp8_test COMPONENT tp RANKS 1 SOURCES gpu/tp_fp8_test.cpp)
