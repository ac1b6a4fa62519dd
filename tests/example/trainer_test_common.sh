# Sourced by the trainer tests (gpt_train_test.sh, moe_train_test.sh) with their arguments
# TRAINER MPIEXEC WORKDIR CASE [mpirun flags...]: sets trainer, mpiexec, work, case and mpi_flags,
# enters a fresh WORKDIR/CASE, and defines run, compare and expect_error. The test sets
# model=(...), the flags of every run, before its first run. here is the test's folder.
trainer=$1 mpiexec=$2 work=$3 case=$4
shift 4
mpi_flags=("$@")
rm -rf "$work/$case" && mkdir -p "$work/$case"
cd "$work/$case"

run() {  # run NAME RANKS FLAGS...: the trainer's JSON lines into NAME.jsonl
  local name=$1 ranks=$2
  shift 2
  echo "--- $name: $ranks ranks: $*"
  "$mpiexec" "${mpi_flags[@]}" -np "$ranks" "$trainer" "${model[@]}" "$@" >"$name.jsonl"
}

# compare A B FIRST LAST TOL: losses of steps FIRST..LAST of runs A and B agree within TOL
# (relative); both runs must have all of those steps.
compare() {
  python3 "$here/compare_losses.py" "$@"
}

# expect_error RANKS MESSAGE FLAGS...: a run of FLAGS at RANKS ranks fails, MESSAGE on its stderr.
expect_error() {
  local ranks=$1 message=$2
  shift 2
  if run bad "$ranks" "$@" 2>bad.err; then echo "expected failure: $*"; exit 1; fi
  grep -q -- "$message" bad.err || { echo "no '$message' in:"; cat bad.err; exit 1; }
}
