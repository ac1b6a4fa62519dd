# Sourced from the repository root by the GPU benchmark scripts (moe_benchmarks.sh,
# llama_benchmarks.sh, gpt_benchmarks.sh): sets $out (the log folder: $OUT, else build/bench/) and
# $skip ($SKIP: run names to leave out) and $only ($ONLY: when set, the only run names to run),
# defines run, run_profile and only_named, and configures build/ when it is not yet (nor holds an
# unpacked prebuilt).
# shellcheck shell=bash
out=${OUT:-build/bench}
mkdir -p "$out"
skip=${SKIP:-}
only=${ONLY:-}
selected() {  # selected NAME: whether $SKIP and $ONLY let run NAME run (says so when not)
  case " $skip " in *" $1 "*) echo "=== $1 skipped"; return 1 ;; esac
  if [ -n "$only" ]; then
    case " $only " in *" $1 "*) ;; *) echo "=== $1 skipped (ONLY)"; return 1 ;; esac
  fi
}
only_named() {  # only_named NAME: whether $ONLY names run NAME (for runs left out by default)
  case " $only " in *" $1 "*) return 0 ;; esac
  echo "=== $1 skipped (runs only when ONLY names it)"
  return 1
}
run() {  # run NAME SECONDS COMMAND...: bounded in time, logged to $out/NAME.log, its result lines
  local name=$1 limit=$2; shift 2
  selected "$name" || return 0
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "=== $name exit $?"
  grep -E '"summary"|"impl"|"bench"|"op"|params|passed|failed|FAILED|error|Error' \
    "$out/$name.log" | tail -n 8
}
kernel_summary_lib() {  # builds build/libkernel_summary.so (kernel_summary.cpp) where CUPTI is
  # installed (the toolkit's include/ and lib64/, or its extras/CUPTI/): prints its path, or
  # nothing (and why, on stderr) where it cannot be built.
  local cuda=${CUDA_HOME:-/usr/local/cuda} src=scripts/bench/kernel_summary.cpp
  local lib=build/libkernel_summary.so inc="" libdir="" d
  for d in "$cuda/include" "$cuda/extras/CUPTI/include"; do
    [ -f "$d/cupti.h" ] && { inc=$d; break; }
  done
  for d in "$cuda/lib64" "$cuda/extras/CUPTI/lib64"; do
    [ -e "$d/libcupti.so" ] && { libdir=$d; break; }
  done
  if [ -z "$inc" ] || [ -z "$libdir" ]; then
    echo "kernel_summary: no CUPTI (cupti.h, libcupti.so) under $cuda" >&2
    return
  fi
  if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ]; then
    mkdir -p build
    # The run-path finds libcupti where the loader would not (extras/CUPTI/lib64).
    if ! "${CXX:-g++}" -O2 -std=c++17 -shared -fPIC "$src" -I"$inc" -I"$cuda/include" \
      -L"$libdir" -Wl,-rpath,"$libdir" -lcupti -o "$lib" >&2; then
      echo "kernel_summary: $src did not build" >&2
      return
    fi
  fi
  echo "$lib"
}
# run_profile NAME SECONDS STEPS BASE COMMAND...: COMMAND twice, with @STEPS@ in its arguments
# replaced by BASE, then by STEPS, each bounded by SECONDS, under build/libkernel_summary.so
# (LD_PRELOAD) writing $out/NAME_BASE.csv and $out/NAME_STEPS.csv (logs $out/NAME_*.log):
# kernel_groups.py's --side NAME CSV STEPS BASE_CSV BASE. The difference holds only when both runs
# do the same start-up work: with PROFILE_WARM=1, a run at BASE steps without the library comes
# first (bounded by SECONDS, log $out/NAME_warm.log), so that torch.compile's compilation and
# autotuning fill their caches there instead of in the BASE run alone. Skipped, saying so, off the
# GPU (DEVICE other than cuda, or no nvidia-smi -L) or where the library cannot be built. An mpirun
# in COMMAND passes both variables to its ranks with -x LD_PRELOAD -x KERNEL_SUMMARY_OUT (empty
# in the warm-up run).
run_profile() {
  local name=$1 limit=$2 steps=$3 base=$4 lib n; shift 4
  selected "$name" || return 0
  if [ "${DEVICE:-cuda}" != cuda ] || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "=== $name skipped (no GPU)"
    return
  fi
  lib=$(kernel_summary_lib 2>"$out/${name}_build.log")
  if [ -z "$lib" ]; then
    echo "=== $name skipped (no libkernel_summary.so: $(tail -n 1 "$out/${name}_build.log"))"
    return
  fi
  local dir args; dir=$(cd "$out" && pwd)  # absolute: the command may change directory
  if [ "${PROFILE_WARM:-0}" = 1 ]; then
    args=("${@//@STEPS@/$base}")
    echo "=== $name (warm-up, $base steps, not profiled): ${args[*]}"
    timeout "$limit" env LD_PRELOAD= KERNEL_SUMMARY_OUT= "${args[@]}" >"$out/${name}_warm.log" 2>&1
    echo "=== $name (warm-up) exit $?"
    grep -E 'error|Error' "$out/${name}_warm.log" | tail -n 3
  fi
  for n in "$base" "$steps"; do
    args=("${@//@STEPS@/$n}")
    rm -f "$out/${name}_$n.csv"
    echo "=== $name ($n steps): ${args[*]}"
    timeout "$limit" env LD_PRELOAD="$(pwd)/$lib" KERNEL_SUMMARY_OUT="$dir/${name}_$n.csv" \
      "${args[@]}" >"$out/${name}_$n.log" 2>&1
    echo "=== $name ($n steps) exit $?"
    grep -E 'kernel_summary|error|Error' "$out/${name}_$n.log" | tail -n 3
  done
}
# profile_table FILE NAME STEPS BASE [NAME STEPS BASE]: kernel_groups.py's table of the sides whose
# two CSVs run_profile wrote, printed and kept in $out/FILE; nothing when none has both.
profile_table() {
  local file=$1 sides=() name; shift
  while [ $# -ge 3 ]; do
    name=$1
    if [ -f "$out/${name}_$2.csv" ] && [ -f "$out/${name}_$3.csv" ]; then
      sides+=(--side "$name" "$out/${name}_$2.csv" "$2" "$out/${name}_$3.csv" "$3")
    fi
    shift 3
  done
  [ ${#sides[@]} -eq 0 ] && return
  echo "=== $file"
  python3 scripts/bench/kernel_groups.py "${sides[@]}" 2>&1 | tee "$out/$file"
}
# Not over an unpacked prebuilt (scripts/device_prebuilt.sh): a CMakeCache.txt there would make
# the next device_session.sh phase's unpack refuse it and rebuild with setup.sh.
if [ ! -f build/CMakeCache.txt ] && [ ! -f build/PREBUILT_COMMIT ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=ON \
    -DQUINTET_BUILD_EXAMPLES=ON >"$out/configure.log" 2>&1
fi
