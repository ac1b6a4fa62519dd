#!/usr/bin/env bash
# GPU tests and benchmarks built on this (CPU) machine and run on the GPU machine, so that a call
# on a fresh GPU machine spends its device time on the GPU rather than on a 135 s build there.
# CUDA compiles here; the programs link libquintet.so and the system's CUDA, NCCL, cuDNN, MPI
# and fmt libraries, whose sonames the GPU machine's Ubuntu has too.
#
#   scripts/device_prebuilt.sh pack [TARGET...]   # here: builds the targets (default: every
#       gpu_* test and 04/05/09's programs) in build/ and copies them with libquintet.so.0 into
#       prebuilt/ (ignored through .git/info/exclude), for the device tool's `carry: ["prebuilt"]`
#   OUT=$OUT scripts/device_prebuilt.sh run       # there: every prebuilt gpu_* test (ctest's
#       one-GPU ones) under `mpirun -np 1`, 4 at a time, then the elementwise op benchmark;
#       each bounded; a summary on stdout, the logs in $OUT/prebuilt_logs.tgz
# Where a test needs more than its binary (ctest's environment or arguments), scripts/
# device_session.sh 0 builds and runs it with ctest on the GPU machine instead.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
mode=${1:?usage: scripts/device_prebuilt.sh pack [TARGET...] | run}
shift
dir=prebuilt
case $mode in
  pack)
    [ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DQUINTET_BUILD_TESTS=ON -DQUINTET_BUILD_EXAMPLES=ON >/dev/null || exit 1
    targets=("$@")
    if [ ${#targets[@]} -eq 0 ]; then
      # ctest's one-GPU gpu tests that are programs of their own (not *_np2, not scripts).
      mapfile -t targets < <(ctest --test-dir build -N -L gpu |
        sed -n 's/^ *Test *#[0-9]*: \(gpu_[a-z0-9_]*\)$/\1/p' | grep -v '_np[2-9]$' |
        sed 's/_np1$//' | sort -u)
      mapfile -t known < <(cmake --build build --target help | sed -n 's/^\.\.\. //p')
      mapfile -t targets < <(printf '%s\n' "${targets[@]}" | grep -Fxf <(printf '%s\n' "${known[@]}"))
      targets+=(04_gpt_train 05_moe_train 09_op_bench)
    fi
    cmake --build build -j "$(nproc)" --target "${targets[@]}" || exit 1
    exclude="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's too
    mkdir -p "$(dirname "$exclude")" "$dir"
    grep -qx "/$dir/" "$exclude" 2>/dev/null || echo "/$dir/" >>"$exclude"
    rm -f "$dir"/*
    cp -L build/libquintet.so.0 "$dir/"
    for t in "${targets[@]}"; do
      f=$(find build/tests build/examples -maxdepth 2 -type f -name "$t" -perm -u+x | head -n 1)
      [ -n "$f" ] && cp "$f" "$dir/"
    done
    du -sh "$dir"
    echo "run it with: run(command=\"OUT=\$OUT bash scripts/device_prebuilt.sh run\", carry=[\"$dir\"])"
    ;;
  run)
    out=${OUT:-build/prebuilt_run}
    mkdir -p "$out"
    export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 LD_LIBRARY_PATH="$PWD/$dir:${LD_LIBRARY_PATH:-}"
    ls "$dir"/gpu_* >/dev/null 2>&1 || { echo "no $dir/gpu_*: run 'pack' on the CPU machine"; exit 1; }
    # shellcheck disable=SC2016  # $0 and $1 expand in the inner bash
    find "$dir" -maxdepth 1 -name 'gpu_*' -print0 | xargs -0 -P 4 -n 1 bash -c \
      'timeout 150 mpirun -np 1 "$1" >"$0/${1##*/}.log" 2>&1; echo "${1##*/} exit $?"' "$out"
    if [ -x "$dir/09_op_bench" ]; then
      timeout 60 "$dir/09_op_bench" --elementwise-only --json >"$out/ops_elementwise.log" 2>&1
      echo "ops_elementwise exit $?"
    fi
    for f in "$out"/gpu_*.log; do
      echo "--- $(basename "$f" .log)"
      grep -E "test cases|All tests passed|No tests ran|skipping|FAILED|due to unexpected" -A2 "$f" |
        head -n 12
    done
    # The device tool brings back 8 files: the logs go back packed.
    (cd "$out" && tar -czf prebuilt_logs.tgz ./*.log && rm -f ./*.log)
    ;;
  *) echo "usage: scripts/device_prebuilt.sh pack [TARGET...] | run" >&2; exit 2 ;;
esac
