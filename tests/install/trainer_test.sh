#!/usr/bin/env bash
# docs/trainer.md's program, built against an installed Quintet (install_find_package), trained at
# tp 2 x dp 2 on 4 CPU ranks; examples/04_gpt_train at the same model, batch, optimizer, schedule,
# data and seed. Their losses agree at each of the 40 steps within 1e-5 relative (the program
# prints 6 decimals), the loss goes down, and the program's checkpoints (steps 20 and 40) exist.
# Run again, the program resumes from step 40 and trains no further step.
# Usage: trainer_test.sh PROGRAM TRAINER_04 MPIEXEC WORKDIR [mpirun flags...]
set -euo pipefail
program=$1 trainer=$2 mpiexec=$3 work=$4
shift 4
mpi_flags=("$@")
rm -rf "$work" && mkdir -p "$work"
cd "$work"
"$mpiexec" "${mpi_flags[@]}" -np 4 "$program" --device cpu >program.log
"$mpiexec" "${mpi_flags[@]}" -np 4 "$trainer" --device cpu --tp 2 --dp 2 --layers 2 --hidden 128 \
  --heads 4 --vocab 256 --seq-len 128 --micro-batch 4 --global-batch 16 --lr 1e-3 --min-lr 1e-4 \
  --warmup 10 --lr-schedule cosine --weight-decay 0.1 --clip 1.0 --steps 40 --seed 1234 \
  --loader-threads 2 --data-dir data/synthetic --json --no-progress >trainer.jsonl
python3 - <<'PY'
import json, re, sys
program = {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+) loss (\S+)", open("program.log").read(), re.M)}
trainer = {}
for line in open("trainer.jsonl"):
    if line.startswith("{") and '"step"' in line:
        rec = json.loads(line)
        trainer[rec["step"]] = rec["loss"]
if sorted(program) != list(range(1, 41)) or sorted(trainer) != list(range(1, 41)):
    sys.exit(f"steps: program {sorted(program)[:3]}... ({len(program)}), 04 {sorted(trainer)[:3]}... ({len(trainer)})")
worst = max(abs(program[s] - trainer[s]) / abs(trainer[s]) for s in program)
print(f"program == 04_gpt_train at steps 1..40: worst relative difference {worst:.3g}")
if worst > 1e-5:
    sys.exit("the program's losses differ from 04_gpt_train's")
if not program[40] < program[1] - 0.1:
    sys.exit(f"the loss did not go down: {program[1]} -> {program[40]}")
PY
test -f checkpoints/step_000020/checkpoint.json && test -f checkpoints/step_000040/checkpoint.json
# Restored at step 40, the program has nothing left to train.
"$mpiexec" "${mpi_flags[@]}" -np 4 "$program" --device cpu >again.log
if grep -q "^step" again.log; then
  echo "the resumed program trained again:"; cat again.log; exit 1
fi
echo "trainer_test: PASS"
