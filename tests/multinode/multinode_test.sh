#!/usr/bin/env bash
# A multi-node job for real: brings up test hosts as network namespaces (scripts/netns_cluster.sh),
# runs Quintet programs on them through `mpirun --hostfile` with MPI restricted to the test
# subnet, checks them, and always takes the hosts down again (also on failure or interrupt).
#
#   multinode_test.sh --cluster scripts/netns_cluster.sh --whoami BIN [--bench BIN]
#                     [--gpt-train BIN] [--hosts 2] [--slots 2]
# A --bench or --gpt-train that is empty or not built skips that step.
#
# Steps (each one a function below; a failing step fails the test):
#   1. whoami: every rank's host, address, local rank and local size, as quintet::init sees them;
#      each host must hold local ranks 0..slots-1 and each rank must sit in its host's namespace.
#   2. collective bench: 01_collective_bench --op all --device cpu, verified by the bench itself
#      (it exits 1 on a wrong result); every JSON line must say "correct":true.
#   3. gpt train (only when --gpt-train names an existing program): tp 2 x dp 2 on the hosts, so
#      tensor-parallel pairs share a host and data-parallel traffic crosses hosts; its per-step
#      loss must equal the one-host run of the same command to 1e-5 relative.
# Exit status: 0 passed, 1 failed, 77 skipped (namespaces cannot be made here).
set -uo pipefail

cluster="" whoami="" bench="" gpt_train="" hosts=2 slots=2
while (($#)); do
  case "$1" in
    --cluster) cluster=$2; shift 2 ;;
    --whoami) whoami=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --gpt-train) gpt_train=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    *) echo "multinode_test: unknown argument '$1'" >&2; exit 1 ;;
  esac
done
if [ ! -x "$cluster" ] || [ ! -x "$whoami" ]; then
  echo "multinode_test: --cluster and --whoami must name programs" >&2
  exit 1
fi
ranks=$((hosts * slots))
net=${QUINTET_NETNS_NET:-10.251.0}

# ---- The flags of the gpt-train step. THE LEAD FILLS THESE IN when 04_gpt_train lands: it must
# ---- run tp 2 x dp 2 (4 ranks) on the CPU and print one JSON object per step with "step" and
# ---- "loss" fields (from rank 0 only, or identical on every rank that prints).
GPT_TRAIN_FLAGS=(--tp 2 --dp 2 --steps 5 --layers 2 --hidden 64 --heads 4 --vocab 512 --seq-len 64
                 --micro-batch 2 --global-batch 8 --device cpu --json)
GPT_TRAIN_RTOL=1e-5

step_timeout=300  # seconds per mpirun; a hang fails the test instead of eating ctest's timeout
common_mpirun_flags=(--bind-to none)
[ "$(id -u)" = 0 ] && common_mpirun_flags+=(--allow-run-as-root)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

fail() {
  echo "multinode_test: FAIL: $*" >&2
  exit 1
}

# mpirun on the test hosts (from the head namespace, with the cluster's hostfile and flags).
mpirun_hosts() { timeout -k 10 "$step_timeout" "$cluster" mpirun "${common_mpirun_flags[@]}" "$@"; }

step_whoami() {
  echo "== whoami: $ranks ranks on $hosts hosts"
  local out
  out=$(mpirun_hosts -np "$ranks" --map-by slot "$whoami") || { echo "$out"; fail "whoami exited with an error"; }
  echo "$out"
  grep -q '^whoami: ok$' <<<"$out" || fail "whoami did not report ok"
  local h l r=0
  for ((h = 1; h <= hosts; h++)); do
    for ((l = 0; l < slots; l++)); do
      # --map-by slot fills host 1 first: rank r is local rank r % slots on host r / slots + 1.
      grep -q "^whoami rank=$r size=$ranks local_rank=$l local_size=$slots host=qnt-h$h addr=$net.$h\$" <<<"$out" ||
        fail "expected rank $r as local rank $l of $slots on qnt-h$h ($net.$h)"
      r=$((r + 1))
    done
  done
}

step_collective_bench() {
  echo "== 01_collective_bench --op all --device cpu on $hosts hosts"
  local out
  out=$(mpirun_hosts -np "$ranks" --map-by slot "$bench" --op all --device cpu --max-bytes 1M \
    --step-factor 16 --iters 3 --warmup 1 --reps 1 --json) || { echo "$out"; fail "01_collective_bench failed"; }
  echo "$out"
  local lines wrong
  lines=$(grep -c '^{' <<<"$out" || true)
  wrong=$(grep '^{' <<<"$out" | grep -v '"correct":true' | grep -c . || true)
  ((lines > 0)) || fail "01_collective_bench printed no results"
  ((wrong == 0)) || fail "$wrong results are not correct"
  grep '^{' <<<"$out" | grep -v -q "\"ranks\":${ranks}[,}]" && fail "a result line does not say \"ranks\":$ranks"
  local op
  for op in all_reduce all_gather reduce_scatter all_to_all broadcast sendrecv; do
    grep -q "\"op\":\"$op\"" <<<"$out" || fail "no result for $op"
  done
  echo "multinode_test: $lines collective results, all correct"
}

# "step loss" per line, one per step, from the JSON lines of a training run.
losses() {
  grep '^{' | grep '"loss"' | sed -E 's/.*"step":([0-9]+).*/\1 &/; s/^([0-9]+) .*"loss":([-0-9.eE+]+).*/\1 \2/' |
    sort -n -u
}

step_gpt_train() {
  echo "== 04_gpt_train ${GPT_TRAIN_FLAGS[*]}: one host, then $hosts hosts"
  local one many
  one=$(timeout -k 10 "$step_timeout" mpirun "${common_mpirun_flags[@]}" --oversubscribe -np "$ranks" \
    "$gpt_train" "${GPT_TRAIN_FLAGS[@]}") || { echo "$one"; fail "04_gpt_train on one host failed"; }
  many=$(mpirun_hosts -np "$ranks" --map-by slot "$gpt_train" "${GPT_TRAIN_FLAGS[@]}") ||
    { echo "$many"; fail "04_gpt_train on $hosts hosts failed"; }
  echo "$many"
  local a b
  a=$(losses <<<"$one")
  b=$(losses <<<"$many")
  [ -n "$a" ] || fail "the one-host run printed no loss (expected JSON lines with \"step\" and \"loss\")"
  echo "one host:  $(tr '\n' ' ' <<<"$a")"
  echo "$hosts hosts: $(tr '\n' ' ' <<<"$b")"
  paste <(echo "$a") <(echo "$b") | awk -v rtol="$GPT_TRAIN_RTOL" '
    { if ($1 != $3) { print "step mismatch: " $1 " vs " $3; bad = 1; next }
      d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2;
      if (d > rtol * m) { printf "step %d: loss %s (one host) vs %s\n", $1, $2, $4; bad = 1 } }
    END { exit bad }' || fail "the multi-host loss differs from the one-host loss"
  [ "$(wc -l <<<"$a")" = "$(wc -l <<<"$b")" ] || fail "the runs printed different numbers of steps"
  echo "multinode_test: losses match the one-host run"
}

# Concurrent runs of this test (another build tree) would share the namespaces: take turns.
exec 9>/tmp/quintet-netns.lock
flock -w 900 9 || fail "another multi-node test held /tmp/quintet-netns.lock for 15 minutes"

trap '"$cluster" down' EXIT
trap 'exit 1' INT TERM HUP
"$cluster" up "$hosts" "$slots"
rc=$?
((rc == 77)) && exit 77
((rc == 0)) || fail "could not bring up $hosts hosts (exit $rc)"

step_whoami
if [ -n "$bench" ] && [ -x "$bench" ]; then
  step_collective_bench
else
  echo "== 01_collective_bench: not built (CLI11 or nlohmann_json missing); step skipped"
fi
if [ -n "$gpt_train" ] && [ -x "$gpt_train" ]; then
  step_gpt_train
else
  echo "== 04_gpt_train: not built; step skipped"
fi
echo "multinode_test: passed"
