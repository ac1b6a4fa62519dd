# nn: ops (forward/backward on the CPU), parameters, modules, layers and the optimizer.
quintet_unit_test(NAME nn_ops_test COMPONENT nn SOURCES unit/nn_ops_test.cpp)
quintet_unit_test(NAME nn_layers_test COMPONENT nn SOURCES unit/nn_layers_test.cpp)
quintet_unit_test(NAME nn_lr_schedule_test COMPONENT nn SOURCES unit/nn_lr_schedule_test.cpp)
quintet_unit_test(NAME nn_recompute_test COMPONENT nn SOURCES unit/nn_recompute_test.cpp)
quintet_unit_test(NAME nn_rope_test COMPONENT nn SOURCES unit/nn_rope_test.cpp)
quintet_unit_test(NAME nn_gqa_attention_test COMPONENT nn SOURCES unit/nn_gqa_attention_test.cpp)
quintet_unit_test(NAME nn_fp8_test COMPONENT nn SOURCES unit/nn_fp8_test.cpp)
# The grouped linear ops (MoE experts) against a loop of linear ops per group, bad offsets.
quintet_unit_test(NAME nn_grouped_linear_test COMPONENT nn SOURCES unit/nn_grouped_linear_test.cpp)
# The grouped GEMM kernels' tile enumeration (a host/device header), on the host.
quintet_unit_test(NAME nn_grouped_gemm_tiles_test COMPONENT nn
                  SOURCES unit/nn_grouped_gemm_tiles_test.cpp)
target_link_libraries(nn_grouped_gemm_tiles_test PRIVATE quintet_nn_private)
# The router's logits ops (x in its own dtype, f32 sums) against cast + linear in f32, bad inputs.
quintet_unit_test(NAME nn_router_ops_test COMPONENT nn SOURCES unit/nn_router_ops_test.cpp)
# Lazy zeroing of the gradients: training steps bit for bit as with zero_grad filling the buffer
# (dense, microbatches, split backward, MoE, FP8 on the CPU), and the accessors' zeros.
quintet_unit_test(NAME nn_lazy_zero_grad_test COMPONENT nn SOURCES unit/nn_lazy_zero_grad_test.cpp)
