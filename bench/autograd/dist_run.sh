#!/usr/bin/env bash
# bench/autograd/dist_run.sh: one training step of the model-parallel example (the MLP 16-H-H-4
# split across two workers, a trainer driving each step through RPC, distributed autograd and the
# DistributedOptimizer) on tdist (examples/model_parallel --bench-steps, under tdrun) and on
# PyTorch's dist_autograd with TorchRPC (torch_model_parallel.py, python3-torch), alternating,
# REPEATS times; prints the median step time of each and the ratio. Builds nothing.
#
#   bash bench/autograd/dist_run.sh [BUILD_DIR (build/plain)] [STEPS (300)] [REPEATS (3)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
steps=${2:-300}
reps=${3:-3}
for bin in "$build/examples/model_parallel" "$build/tools/tdrun/tdrun"; do
  [ -x "$bin" ] || { echo "bench/autograd: $bin is missing (make build)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import torch.distributed.rpc' 2>/dev/null || { echo "bench/autograd: needs python3-torch (apt-get install python3-torch)" >&2; exit 1; }
td=(); pt=()
for r in $(seq "$reps"); do
  td+=("$("$build/tools/tdrun/tdrun" --standalone --quiet --nproc-per-node 3 "$build/examples/model_parallel" \
          --bench-steps "$steps" | sed -n 's/.*step_ms //p')")
  pt+=("$(OMP_NUM_THREADS=1 /usr/bin/python3 bench/autograd/torch_model_parallel.py --steps "$steps" 2>/dev/null | sed -n 's/^step_ms //p')")
done
/usr/bin/python3 - "${td[*]}" "${pt[*]}" <<'PY'
import statistics, sys
td = [float(v) for v in sys.argv[1].split()]
pt = [float(v) for v in sys.argv[2].split()]
a, b = statistics.median(td), statistics.median(pt)
print("Model-parallel training step (MLP 16-96-96-4, batch 64, 2 stages + trainer), median of %d runs" % len(td))
print("| | tdist | PyTorch dist_autograd + TorchRPC | tdist speed-up |")
print("| --- | ---: | ---: | ---: |")
print("| step (ms) | %.3f | %.3f | %.2fx |" % (a, b, b / a))
PY
