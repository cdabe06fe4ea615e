#!/usr/bin/env bash
# Reduce kernel bandwidth (docs/performance.md, "Reduce kernels"): runs reduce_bench from the given
# build folder, then lists which kernel loops gcc vectorized.
# Usage: bench/reduce/run.sh BUILD_DIR [SIZE_MIB [REPS]]
set -euo pipefail
build=${1:-build/plain}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/bench/reduce/reduce_bench"
if [ ! -x "$bin" ]; then
    cmake --build "$build" --target reduce_bench >/dev/null
fi
"$bin" "${2:-64}" "${3:-5}"
echo
echo "Vectorized loops (gcc -O3 -fopt-info-vec-optimized on src/tensor/reduce.c):"
"$here/vec_report.sh" "$build"
