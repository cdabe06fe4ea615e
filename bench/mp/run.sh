#!/usr/bin/env bash
# bench/mp: tensors through td_mp_queue (mp_bench) beside a pipe copy and beside torch.multiprocessing's
# queue (Debian's python3-torch, installed when missing; run with Debian's /usr/bin/python3), in one run; prints the table of
# docs/performance.md "Multiprocessing queue".
#   bash bench/mp/run.sh [build-dir] [--quick]
set -euo pipefail
build=${1:-build/plain}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
fi
[ -x "$build/bench/mp/mp_bench" ] || cmake --build "$build" --target mp_bench tdist-shm-manager -j2 >/dev/null
echo "| size | what | tensors | tensors/s | GB/s | µs per tensor |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
"$build/bench/mp/mp_bench" "$@"
/usr/bin/python3 "$here/torch_mp_bench.py" "$@" 2>/dev/null
