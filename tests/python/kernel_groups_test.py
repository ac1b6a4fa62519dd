#!/usr/bin/env python3
"""Tests of scripts/bench/kernel_groups.py on made-up kernel_summary.cpp CSVs, run by ctest
(tests/cmake/python.cmake): every group's pattern against kernel names of ours, cuBLAS, cuDNN and
PyTorch's, the groups summing to the total, the per-step difference of two runs, the side-by-side
table, a side whose two runs did different start-up work flagged, and the refusal of bad input. Plain asserts (`python3 kernel_groups_test.py`, which prints
"N passed, N failed") or under pytest.
"""
import contextlib
import io
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "bench"))
import kernel_groups as kg  # noqa: E402
from plain_tests import run_tests  # noqa: E402

# (kernel name as CUPTI gives it, the group it belongs to)
NAMES = [
    ("_ZN7quintet2nn4cuda12_GLOBAL__N_120grouped_wgmma_kernelILi128EEEvNS2_6ParamsE", "GEMM"),
    ("_ZN7quintet2nn4cuda18grouped_mma_kernelIfEEvPKfS4_", "GEMM"),
    ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopA_NNT", "GEMM"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "GEMM"),
    ("void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<GroupProblemShape>>",
     "GEMM"),
    ("triton_tem_fused_mm_0", "GEMM"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>",
     "attention"),
    ("_ZN7quintet2nn4cuda19norm_forward_kernelI13__nv_bfloat16EEvPKT_", "norm"),
    ("triton_per_fused_add_native_layer_norm_native_layer_norm_backward_7", "norm"),
    ("_ZN7quintet2nn4cuda23gelu_forward_vec_kernelEPK13__nv_bfloat16", "activation"),
    ("triton_poi_fused_add_mul_pow_tanh_12", "activation"),
    ("_ZN7quintet2nn4cuda22swiglu_backward_kernelIfEEvPKT_", "activation"),
    ("_ZN7quintet2nn4cuda12route_kernelIfEEvPKfPiPf", "MoE routing/permutation"),
    ("_ZN7quintet2nn4cuda18route_stats_kernelEPKfPf", "MoE routing/permutation"),
    ("_ZN7quintet2nn4cuda21permute_gather_kernelI13__nv_bfloat16EEvPKT_", "MoE routing/permutation"),
    ("_ZN7quintet2nn4cuda25unpermute_backward_kernelIfEEvPKT_", "MoE routing/permutation"),
    ("void at::native::(anonymous namespace)::sort_postprocess_kernel<long>", "MoE routing/permutation"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<Policy900, false>",
     "MoE routing/permutation"),
    ("void at::native::index_elementwise_kernel<128, 4, gpu_index_kernel>", "MoE routing/permutation"),
    ("triton_poi_fused_scatter_add_zeros_3", "MoE routing/permutation"),
    ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>", "MoE routing/permutation"),
    ("_ZN7quintet2nn4cuda17adamw_many_kernelEv", "optimizer"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("_ZN7quintet2nn4cuda20sum_of_squares_kernelEPKff", "optimizer"),
    ("_ZN7quintet2nn4cuda21vp_ce_partials_kernelI13__nv_bfloat16lEEvPKT_", "cross-entropy"),
    ("triton_red_fused__log_softmax_nll_loss_forward_9", "cross-entropy"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "LogSoftMaxForwardEpilogue>", "cross-entropy"),
    ("_ZN7quintet2nn4cuda26embedding_backward_kernelI13__nv_bfloat16EEvPKT_", "embedding"),
    ("void at::native::reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, sum_functor>>>",
     "reductions"),
    ("_ZN7quintet2nn4cuda17column_sum_kernelI13__nv_bfloat16EEvPKT_", "reductions"),
    ("triton_red_fused_sum_4", "reductions"),
    ("_ZN7quintet4core4cuda24copy_convert_kernelIffEEvPKT_", "elementwise/copies"),
    ("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", "elementwise/copies"),
    ("triton_poi_fused__to_copy_5", "elementwise/copies"),
    ("_ZN7quintet2nn4cuda11rope_kernelIfEEvPKT_", "elementwise/copies"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
    # (lib/nn/cuda/fp8.cu's casts and its untemplated scale kernel; elementwise.cu's scale_kernel<T>)
    ("_ZN7quintet2nn8cuda_ops12_GLOBAL__N_111cast_kernelI13__nv_bfloat16EEvPKT_llPKfPhS8_Pj",
     "FP8 casts/scales"),
    ("_ZN7quintet2nn8cuda_ops12_GLOBAL__N_115cast_vec_kernelI13__nv_bfloat16EEvPK5Vec16IT_E",
     "FP8 casts/scales"),
    ("_ZN7quintet2nn8cuda_ops12_GLOBAL__N_112scale_kernelEPKfPfS3_fibb", "FP8 casts/scales"),
    ("_ZN7quintet2nn8cuda_ops12_GLOBAL__N_112scale_kernelIfEEvPKT_fPS4_l", "elementwise/copies"),
    ("some_kernel_nobody_named", "other"),
]


def write_csv(directory, name, rows):
    """rows: [(kernel, calls, total_ms)]; written as kernel_summary.cpp writes its CSV."""
    path = os.path.join(directory, name)
    total = sum(ms for _, _, ms in rows) or 1.0
    with open(path, "w") as f:
        f.write("name,calls,total_ms,mean_us,share\n")
        for kernel, calls, ms in rows:
            kernel = kernel.replace('"', "'")
            f.write(f'"{kernel}",{calls},{ms:.3f},{1000 * ms / calls:.2f},{ms / total:.4f}\n')
    return path


def run(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        kg.main(argv)
    return buf.getvalue()


def refused(argv, words):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            kg.main(argv)
    except SystemExit as e:
        assert e.code != 0 and words in str(e.code), (argv, e.code)
        return
    raise AssertionError(f"{argv} was accepted")


def test_groups_by_name():
    for name, group in NAMES:
        assert kg.group_of(name) == group, (name, kg.group_of(name), group)
    # every group is reached by some name above
    assert {g for _, g in NAMES} == set(kg.GROUP_NAMES)


def test_groups_sum_to_total_and_difference():
    with tempfile.TemporaryDirectory() as d:
        # 10 steps against 4: each kernel's per-step time is (long - base) / 6
        long_rows = [(n, 10 * (i + 1) + 3, 12.0 * (i + 1) + 5.0) for i, (n, _) in enumerate(NAMES)]
        base_rows = [(n, 4 * (i + 1) + 3, 6.0 * (i + 1) + 5.0) for i, (n, _) in enumerate(NAMES)]
        long_rows.append(("startup_only_kernel", 1, 500.0))  # in the long run only: counted
        long_csv = write_csv(d, "long.csv", long_rows)
        base_csv = write_csv(d, "base.csv", base_rows)
        out = json.loads(run(["--side", "ours", long_csv, "10", base_csv, "4", "--json"]))
        s = out["kernel_groups"]["ours"]
        assert s["steps"] == 6
        expected_total = sum(1.0 * (i + 1) for i in range(len(NAMES))) + 500.0 / 6
        assert abs(s["total_ms"] - expected_total) < 1e-9, (s["total_ms"], expected_total)
        assert abs(sum(s["groups"].values()) - s["total_ms"]) < 1e-9
        # the kernel at index i of NAMES contributes i + 1 ms per step to its group
        gemm = sum(i + 1.0 for i, (_, g) in enumerate(NAMES) if g == "GEMM")
        assert abs(s["groups"]["GEMM"] - gemm) < 1e-9
        assert abs(s["groups"]["other"] - (len(NAMES) + 500.0 / 6)) < 1e-9
        top = s["top"]
        assert len(top) == 10 and top[0][0] == "startup_only_kernel"
        assert [t[2] for t in top] == sorted((t[2] for t in top), reverse=True)
        # the calls per step are differenced too: (10 (i+1) + 3 - 4 (i+1) - 3) / 6 = i + 1
        last = NAMES[-1][0]
        assert any(t[0] == last and abs(t[3] - len(NAMES)) < 1e-9 for t in top)
        # without a base: the whole run over its steps
        out = json.loads(run(["--side", "ours", long_csv, "10", "--json", "--top", "3"]))
        s = out["kernel_groups"]["ours"]
        assert abs(s["total_ms"] - sum(r[2] for r in long_rows) / 10) < 1e-9
        assert len(s["top"]) == 3


def test_side_by_side_table():
    with tempfile.TemporaryDirectory() as d:
        ours = write_csv(d, "ours.csv", [(NAMES[0][0], 8, 40.0), (NAMES[8][0], 8, 8.0)])
        torch = write_csv(d, "torch.csv", [(NAMES[3][0], 8, 32.0), (NAMES[9][0], 16, 16.0),
                                           (NAMES[6][0], 8, 8.0)])
        text = run(["--side", "ours", ours, "8", "--side", "torch", torch, "8"])
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in text.splitlines() if line.startswith("| ")}
        assert rows["group"] == ["ours ms/step", "torch ms/step", "ours share", "torch share",
                                 "ours - torch"]
        assert rows["GEMM"] == ["5.000", "4.000", "83.3%", "57.1%", "+1.000"], rows["GEMM"]
        assert rows["norm"] == ["1.000", "2.000", "16.7%", "28.6%", "-1.000"], rows["norm"]
        assert rows["attention"] == ["0.000", "1.000", "0.0%", "14.3%", "-1.000"]
        assert rows["total"] == ["6.000", "7.000", "100.0%", "100.0%", "-1.000"], rows["total"]
        assert "optimizer" not in rows  # groups with no time on either side are left out
        assert "ours: the 2 largest kernels" in text and "torch: the 3 largest kernels" in text


def test_different_start_up_work_flagged():
    # torch.compile's case: the base run compiles and autotunes (a kernel called many times), the
    # longer run finds its caches warm, so its difference is negative for that kernel's group.
    with tempfile.TemporaryDirectory() as d:
        ours_long = write_csv(d, "ours_12.csv", [(NAMES[0][0], 12, 24.0)])
        ours_base = write_csv(d, "ours_4.csv", [(NAMES[0][0], 4, 8.0)])
        copy = "triton_poi_fused__to_copy_5"  # elementwise/copies
        torch_long = write_csv(d, "torch_10.csv", [(NAMES[3][0], 10, 20.0), (copy, 100, 10.0)])
        torch_base = write_csv(d, "torch_2.csv", [(NAMES[3][0], 2, 4.0), (copy, 17639, 400.0)])
        argv = ["--side", "ours", ours_long, "12", ours_base, "4",
                "--side", "torch", torch_long, "10", torch_base, "2"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = kg.main(argv)
        text = buf.getvalue()
        assert rc == 1, rc
        flagged = [line for line in text.splitlines() if "NOT per-step figures" in line]
        assert len(flagged) == 1 and flagged[0].startswith("torch: "), flagged
        assert "elementwise/copies -48.750" in flagged[0], flagged[0]
        head = [line for line in text.splitlines() if line.startswith("| group")][0]
        assert "torch (NOT per-step) ms/step" in head and "ours (NOT" not in head, head
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            rc = kg.main(argv + ["--json"])
        sides = json.loads(buf.getvalue())["kernel_groups"]
        assert rc == 1 and sides["ours"]["negative_groups"] == {}
        assert sides["torch"]["negative_groups"] == {"elementwise/copies": -48.75}
        # the same runs after a warm-up: the same kernels in both, nothing flagged
        torch_base = write_csv(d, "torch_2.csv", [(NAMES[3][0], 2, 4.0), (copy, 20, 2.0)])
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            rc = kg.main(argv)
        assert rc == 0 and "NOT per-step" not in buf.getvalue(), buf.getvalue()
        # a small negative difference (timing noise: -0.0375 ms/step) is no sign of it
        torch_base = write_csv(d, "torch_2.csv", [(NAMES[3][0], 2, 4.0), (copy, 100, 10.3)])
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            rc = kg.main(argv)
        assert rc == 0 and "NOT per-step" not in buf.getvalue(), buf.getvalue()


def test_bad_input_refused():
    with tempfile.TemporaryDirectory() as d:
        good = write_csv(d, "good.csv", [(NAMES[0][0], 2, 1.0)])
        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write("kernel,time\nx,1\n")
        bad_row = os.path.join(d, "bad_row.csv")
        with open(bad_row, "w") as f:
            f.write('name,calls,total_ms,mean_us,share\n"k",two,1.0,1,1\n')
        refused(["--side", "ours", bad, "4"], "not a kernel_summary CSV")
        refused(["--side", "ours", bad_row, "4"], "bad calls or total_ms")
        refused(["--side", "ours", os.path.join(d, "missing.csv"), "4"], "missing.csv")
        refused(["--side", "ours", good, "4", good, "4"], "must exceed")
        refused(["--side", "ours", good, "0"], "must exceed")
        refused(["--side", "ours", good, "x"], "integers")
        refused(["--side", "ours", good], "want NAME CSV STEPS")
        refused(["--side", "a", good, "4", "--side", "a", good, "4"], "its own NAME")


def main():
    return run_tests(globals())


if __name__ == "__main__":
    sys.exit(main())
