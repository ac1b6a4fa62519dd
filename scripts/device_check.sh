#!/usr/bin/env bash
# On a GPU machine: configure and build (all cores), run every ctest including the GPU tests, then
# run each benchmark command given as an argument (one quoted string each). The whole log and a
# short report go to $OUT when set (else build/device_check/); a summary table ends the output.
#
#   scripts/device_check.sh "mpirun -np 2 build/examples/01_collective_bench/01_collective_bench --op all --device cuda"
# CTEST_ARGS adds ctest arguments (default: -E sanitize, since the sanitizer builds are CI's job).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/build/device_check}
mkdir -p "$out"
log=$out/device_check.log
report=$out/report.md
: >"$log"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

status=()
step() {  # step NAME COMMAND...: runs, logs, records PASS/FAIL and seconds
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$log"
  if "$@" >>"$log" 2>&1; then status+=("PASS|$name|$((SECONDS - t0))"); else status+=("FAIL|$name|$((SECONDS - t0))"); fi
}

{
  echo "# Quintet device check, $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/- GPU: /'
  echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$report"

step build bash scripts/setup.sh
step ctest bash -c "cd build && ctest --output-on-failure -j4 --timeout 900 ${CTEST_ARGS:--E sanitize}"
grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|\*\*\*Failed|Not Run" "$log" | tail -40 >"$out/ctest_summary.txt"
i=0
for cmd in "$@"; do
  i=$((i + 1))
  step "bench$i" bash -c "$cmd"
done

{
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  for s in "${status[@]}"; do IFS='|' read -r r n t <<<"$s"; echo "| $n | $r | $t |"; done
  echo
  echo "ctest:"
  echo '```'
  cat "$out/ctest_summary.txt"
  echo '```'
} >>"$report"
cat "$report"
for s in "${status[@]}"; do [[ $s == FAIL* ]] && exit 1; done
exit 0
