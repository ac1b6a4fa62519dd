#!/usr/bin/env bash
# Builds libquintet and one suite of tests with a sanitizer (CPU only) and runs them.
#
#   scripts/sanitize.sh [thread|address] [build dir] [data|collectives]
#
#   data         the loader, sampler, formats, synthetic data and safetensors files (unit tests)
#   collectives  the MPI backend: its progress thread, flight recorder, watchdog and the laggard's
#                decision (unit tests), the watchdog naming a held-back rank at 2 ranks, and the
#                MPI communicators' splits, validation, failure handling (the job monitor's
#                deadlines, first-error broadcast and the laggard's naming) and the collective
#                check, at 2 and 3 ranks
#
# The build dir (default build-sanitize-<kind>) is separate from the normal build and is reused,
# so only the first run compiles everything. Only libquintet and the suite's test targets are
# built (-O1, minimal debug info) to keep it quick on CI's two cores. Exits non-zero when a test
# fails or the sanitizer reports a data race, a memory error or (data suite) a leak. What
# ThreadSanitizer reports inside Open MPI itself is suppressed (scripts/sanitize_tsan.supp).
set -euo pipefail
kind=${1:-thread}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${2:-$root/build-sanitize-$kind}
suite=${3:-data}
jobs=${JOBS:-2}
case "$kind" in
  thread|address) ;;
  *) echo "usage: $0 [thread|address] [build dir] [data|collectives]" >&2; exit 2 ;;
esac
case "$suite" in
  data)
    targets=(data_format_test data_sampler_test data_loader_test data_synthetic_test
             data_safetensors_test)
    tests=("${targets[@]}") ;;
  collectives)
    # Not collectives_ops_test: its half-million-element operations at 3 ranks on 2 cores run
    # past the communicators' 60 s deadline under ThreadSanitizer; the splits, validation and
    # check tests issue every kind of operation, on smaller tensors.
    targets=(collectives_progress_thread_test collectives_flight_recorder_test
             collectives_watchdog_test collectives_laggard_test collectives_watchdog_laggard_test
             collectives_split_test collectives_validation_test collectives_failure_test
             collectives_check_test)
    tests=(collectives_progress_thread_test collectives_flight_recorder_test
           collectives_watchdog_test collectives_laggard_test collectives_watchdog_laggard_test_np2
           collectives_split_test_np3 collectives_validation_test_np2
           collectives_failure_test_np2 collectives_check_test_np3) ;;
  *) echo "usage: $0 [thread|address] [build dir] [data|collectives]" >&2; exit 2 ;;
esac

mkdir -p "$(dirname "$build")"
start=$(date +%s)
cmake -S "$root" -B "$build" -DQUINTET_SANITIZE="$kind" -DQUINTET_WITH_CUDA=OFF \
  -DQUINTET_BUILD_TESTS=ON -DQUINTET_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target quintet "${targets[@]}"
built=$(date +%s)

# history_size=7: enough history to restore the stacks of both sides of a report, so that a race
# inside Open MPI's progress engine is matched by the suppressions (not "failed to restore").
export TSAN_OPTIONS="halt_on_error=1 history_size=7 second_deadlock_stack=1 suppressions=$root/scripts/sanitize_tsan.supp ${TSAN_OPTIONS:-}"
# Leak detection for the data suite only: Open MPI unloads its components at MPI_Finalize, so
# the leaks it leaves in them are reported with stacks of "<unknown module>" that no suppression
# can name. The MPI suites still stop at any memory error (overflow, use after free, ...).
leaks=1
[[ $suite == data ]] || leaks=0
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=$leaks ${ASAN_OPTIONS:-}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
ctest --test-dir "$build" -R "$regex" --output-on-failure
echo "sanitize.sh ($kind, $suite): build $((built - start)) s, tests $(( $(date +%s) - built )) s"
