# Sourced from the repository root by the GPU benchmark scripts (moe_benchmarks.sh,
# llama_benchmarks.sh): sets $out (the log folder: $OUT, else build/bench/) and $skip ($SKIP: run
# names to leave out) and $only ($ONLY: when set, the only run names to run), defines run, and
# configures build/ when it is not yet.
# shellcheck shell=bash
out=${OUT:-build/bench}
mkdir -p "$out"
skip=${SKIP:-}
only=${ONLY:-}
run() {  # run NAME SECONDS COMMAND...: bounded in time, logged to $out/NAME.log, its result lines
  local name=$1 limit=$2; shift 2
  case " $skip " in *" $name "*) echo "=== $name skipped"; return ;; esac
  if [ -n "$only" ]; then
    case " $only " in *" $name "*) ;; *) echo "=== $name skipped (ONLY)"; return ;; esac
  fi
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "=== $name exit $?"
  grep -E '"summary"|"impl"|"bench"|"op"|params|passed|failed|FAILED|error|Error' \
    "$out/$name.log" | tail -n 8
}
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=ON \
    -DQUINTET_BUILD_EXAMPLES=ON >"$out/configure.log" 2>&1
fi
