#!/usr/bin/env bash
# Builds everything (scripts/setup.sh), then runs every test with ctest. Non-zero on any failure.
# GPU tests report "skipped" where no GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900
