# Expert parallelism: the router against references and finite differences (one process), and the
# MoE layer under mpirun at ep 1..4 (odd included), with etp 2 and tp 2 (+sp), against one rank.
quintet_unit_test(NAME ep_router_test COMPONENT ep SOURCES unit/ep_router_test.cpp)
# The fused MoE ops (nn::moe_route_*, moe_permute, moe_unpermute) on the CPU against the router's
# and the permutation's step-by-step functions and finite differences.
quintet_unit_test(NAME ep_moe_ops_test COMPONENT ep SOURCES unit/ep_moe_ops_test.cpp)
# The whole MoE layer on one rank against a per-token f64 reference and its finite differences.
quintet_unit_test(NAME ep_moe_reference_test COMPONENT ep SOURCES unit/ep_moe_reference_test.cpp)
# The MoE traps: balancing on by default, the warning about idle experts.
quintet_unit_test(NAME ep_moe_traps_test COMPONENT ep SOURCES unit/ep_moe_traps_test.cpp)
# The experts' device-offsets form against their host-counts form, padding rows.
quintet_unit_test(NAME ep_experts_test COMPONENT ep SOURCES unit/ep_experts_test.cpp)
quintet_mpi_test(NAME ep_moe_test COMPONENT ep RANKS 1 2 3 4 SOURCES mpi/ep_moe_test.cpp)
# The MoE layer's three parts at ep 1..4, etp 2 and tp 2 (+sp) against the per-token f64
# reference and its finite differences (dropless, capacity, skewed routing).
quintet_mpi_test(NAME ep_moe_reference_layouts_test COMPONENT ep RANKS 1 2 3 4
                 SOURCES mpi/ep_moe_reference_layouts_test.cpp)
# The router and the MoE layer on one GPU against the CPU ones (f32 and bf16).
quintet_gpu_test(NAME gpu_ep_moe_test COMPONENT ep SOURCES gpu/ep_moe_gpu_test.cpp)
# The fused MoE ops' CUDA kernels against the CPU ops (ties, k = E, many experts, empty experts,
# the capacity, f32 and bf16 rows).
quintet_gpu_test(NAME gpu_ep_moe_ops_test COMPONENT ep SOURCES gpu/ep_moe_ops_gpu_test.cpp)
# The MoE layer's host synchronisations by quintet::host_sync_count: none in forward and backward
# at ep 1 (tp 1, tp 2 with and without sp; dropless and dropping), exactly the count exchange's one
# per forward with an exchange (ep 2, etp 2), one at the step's end; the device-counted statistics
# against one rank's.
quintet_mpi_test(NAME ep_host_sync_test COMPONENT ep RANKS 1 2 SOURCES mpi/ep_host_sync_test.cpp)
# The FP8 experts (per-tensor scales over the stage) at dp-1 layouts against one rank's FP8
# layer, current and delayed scaling; ep 2 against ep 1 at dp 2; bad FP8 settings refused.
quintet_mpi_test(NAME ep_fp8_test COMPONENT ep RANKS 2 4 SOURCES mpi/ep_fp8_test.cpp)
