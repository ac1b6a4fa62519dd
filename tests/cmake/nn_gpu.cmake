# nn on the GPU: every CUDA op against the CPU op (bf16 and f32, odd shapes), the attention
# block/offset form, bad inputs. Exit 77 (skipped) without a GPU.
quintet_gpu_test(NAME gpu_nn_dense_ops_test COMPONENT nn SOURCES gpu/nn_dense_ops_test.cpp)
quintet_gpu_test(NAME gpu_nn_attention_test COMPONENT nn SOURCES gpu/nn_attention_test.cpp)
# Attention through cuDNN against the CPU op, the ring block form, and the fallbacks.
quintet_gpu_test(NAME gpu_nn_attention_cudnn_test COMPONENT nn
                 SOURCES gpu/nn_attention_cudnn_test.cpp)
quintet_gpu_test(NAME gpu_nn_train_ops_test COMPONENT nn SOURCES gpu/nn_train_ops_test.cpp)
# RoPE and grouped-query attention on the GPU against the CPU ops.
quintet_gpu_test(NAME gpu_nn_rope_test COMPONENT nn SOURCES gpu/nn_rope_test.cpp)
quintet_gpu_test(NAME gpu_nn_gqa_attention_test COMPONENT nn SOURCES gpu/nn_gqa_attention_test.cpp)
# FP8: the casts bit for bit against the CPU's, the scale kernel, the FP8 GEMM against the CPU
# emulation within one ULP. (The nn layer's private root: the cast kernels' amax-only form.)
quintet_gpu_test(NAME gpu_nn_fp8_test COMPONENT nn SOURCES gpu/nn_fp8_test.cpp)
target_link_libraries(gpu_nn_fp8_test PRIVATE quintet_nn_private)
# The grouped linear ops' kernel (offsets on the device) and per-group loop against per-group f64
# products: empty groups, one row, partial tiles, odd widths, skew, padding; the path choice; the
# same with QUINTET_GROUPED_GEMM=wgmma (the Hopper kernel).
quintet_gpu_test(NAME gpu_nn_grouped_gemm_test COMPONENT nn SOURCES gpu/nn_grouped_gemm_test.cpp)
# (cudaDeviceGetAttribute: whether the GPU is sm_90, where the wgmma kernel runs.)
target_link_libraries(gpu_nn_grouped_gemm_test PRIVATE quintet_device_libs)
# The grouped FP8 ops' kernels (FP8 tensor cores, SIMT) and per-group cuBLASLt loop against
# per-group f64 products of the dequantised operands: the same shape classes, all three products;
# the same with QUINTET_GROUPED_GEMM=wgmma (the Hopper FP8 kernel).
quintet_gpu_test(NAME gpu_nn_grouped_fp8_test COMPONENT nn SOURCES gpu/nn_grouped_fp8_test.cpp)
target_link_libraries(gpu_nn_grouped_fp8_test PRIVATE quintet_device_libs)
# The router's logits ops' CUDA kernels against the CPU ops and against cast + f32 linear ops
# (E = 3, 8, 64, 200; d = 1024 and 301; f32 and bf16 x); bad inputs.
quintet_gpu_test(NAME gpu_nn_router_ops_test COMPONENT nn SOURCES gpu/nn_router_ops_test.cpp)
