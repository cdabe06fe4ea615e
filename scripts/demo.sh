#!/usr/bin/env bash
# `make demo`: the main job. Four ranks started by tdrun train a small MLP data-parallel on the
# default backend, through DDP on tdist's autograd (examples/ddp_train.c). Exits non-zero if
# training does not reach the target accuracy or the ranks' parameters differ.
set -euo pipefail
build=${1:-build/plain}
echo "=== tdrun --standalone --nproc-per-node 4 examples/ddp_train"
exec "$build/tools/tdrun/tdrun" --standalone --nproc-per-node 4 "$build/examples/ddp_train"
