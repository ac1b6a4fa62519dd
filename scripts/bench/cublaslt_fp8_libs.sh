#!/usr/bin/env bash
# Which cuBLASLt an FP8 matmul gets on this machine, and whether another copy of the library runs
# it (#45): cublaslt_fp8_probe.cu found every FP8 form NOT_SUPPORTED at run time (the heuristic
# offers algorithms) with the toolkit's cuBLASLt 13.1 on a CUDA 13.0 runtime and driver 580.
# Prints the driver, the toolkit's and every other libcublasLt on the machine, PyTorch's own FP8
# product (torch._scaled_mm, its bundled cuBLASLt), then runs the probe once per other library
# directory (LD_LIBRARY_PATH first). Usage: scripts/bench/cublaslt_fp8_libs.sh PROBE_BINARY
set -uo pipefail
probe=${1:?usage: cublaslt_fp8_libs.sh PROBE_BINARY}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version 2>/dev/null | tail -n 2
echo "== the probe's libraries"
ldd "$probe" | grep -Ei 'cublas|cudart'
echo "== every libcublasLt on the machine"
libs=$(find / -xdev -name 'libcublasLt.so.*' -not -name '*.so.*.*.*.*' 2>/dev/null | sort)
for l in $libs; do echo "$l -> $(readlink -f "$l")"; done
echo "== PyTorch's FP8 product"
python3 - <<'PY' 2>&1 | tail -n 4
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
a = torch.randn(64, 128, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(48, 128, device="cuda").to(torch.float8_e4m3fn).t()
one = torch.tensor(1.0, device="cuda")
y = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
ref = a.float() @ b.float()
print("torch._scaled_mm ok, max abs diff", (y.float() - ref).abs().max().item())
PY
for dir in $(for l in $libs; do dirname "$l"; done | sort -u); do
  echo "== the probe with LD_LIBRARY_PATH=$dir"
  LD_LIBRARY_PATH=$dir "$probe" 2>&1 | sed -n '1p;/^forward as fp8_gemm/p;/^large forward (bias/p' | cut -c1-160
  LD_LIBRARY_PATH=$dir "$probe" 2>&1 | grep -o 'CUBLAS_STATUS_[A-Z_]*\| ok' | sort | uniq -c
done
