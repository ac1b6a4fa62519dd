#!/usr/bin/env bash
# Builds libquintet and the data unit tests with a sanitizer (CPU only) and runs them.
#
#   scripts/sanitize_data.sh [thread|address] [build dir]
#
# The build dir (default build-sanitize-<kind>) is separate from the normal build and is reused,
# so only the first run compiles everything. Only libquintet and the data test targets are built
# (-O1, minimal debug info) to keep it quick on CI's two cores. Exits non-zero when a test fails
# or the sanitizer reports a data race, a leak or a memory error.
set -euo pipefail
kind=${1:-thread}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${2:-$root/build-sanitize-$kind}
jobs=${JOBS:-2}
case "$kind" in
  thread|address) ;;
  *) echo "usage: $0 [thread|address] [build dir]" >&2; exit 2 ;;
esac
tests=(data_format_test data_sampler_test data_loader_test data_synthetic_test data_safetensors_test)

start=$(date +%s)
cmake -S "$root" -B "$build" -DQUINTET_SANITIZE="$kind" -DQUINTET_WITH_CUDA=OFF \
  -DQUINTET_BUILD_TESTS=ON -DQUINTET_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target quintet "${tests[@]}"
built=$(date +%s)

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 ${ASAN_OPTIONS:-}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
ctest --test-dir "$build" -R "$regex" --output-on-failure
echo "sanitize_data.sh ($kind): build $((built - start)) s, tests $(( $(date +%s) - built )) s"
