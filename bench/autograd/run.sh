#!/usr/bin/env bash
# Local autograd speed (docs/performance.md): the examples' MLP step through tdist's autograd beside
# its hand-written backward (autograd_bench) and PyTorch's CPU autograd on one thread
# (torch_mlp.py, through /usr/bin/python3 with python3-torch). Builds nothing.
# Usage: bench/autograd/run.sh BUILD_DIR [REPS]
set -euo pipefail
build=${1:-build/plain}
reps=${2:-2000}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/bench/autograd/autograd_bench"
if [ ! -x "$bin" ]; then
    echo "autograd_bench not built in $build (cmake --build $build --target autograd_bench)" >&2
    exit 1
fi
out=$("$bin" "$reps")
echo "$out"
hand=$(echo "$out" | awk '/hand-written/ {print $(NF-1)}')
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    /usr/bin/python3 "$here/torch_mlp.py" "$reps" "$hand"
else
    echo "(python3-torch not installed: no PyTorch row)"
fi
