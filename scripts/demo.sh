#!/usr/bin/env bash
# Builds Quintet (scripts/setup.sh), then runs the most complete example there is. Today that is
# the 5-D layout tool on a 16-rank job and the collective benchmark on 4 CPU ranks; it moves to
# the GPT trainer (examples/04_gpt_train) once that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ex=build/examples
if [ -x $ex/04_gpt_train/04_gpt_train ]; then
  exec mpirun --oversubscribe -np 4 $ex/04_gpt_train/04_gpt_train --tp 2 --dp 2 --device cpu "$@"
fi
[ -x $ex/02_layout/02_layout ] && $ex/02_layout/02_layout --world 16 --tp 2 --pp 2 --ep 2
if [ -x $ex/01_collective_bench/01_collective_bench ]; then
  mpirun --oversubscribe -np 4 $ex/01_collective_bench/01_collective_bench --op all --device cpu \
    --max-bytes 16M "$@"
fi
