#!/usr/bin/env bash
# bench/device: the device runtime's allocator, copies and comm primitives (device_bench) on
# simulated devices, and on CUDA beside PyTorch's torch.cuda (torch_device_bench.py) when a GPU and
# a CUDA PyTorch are present; prints the tables of docs/performance.md "Device runtime".
#   bash bench/device/run.sh [build-dir] [--quick]
set -euo pipefail
build=${1:-build/plain}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$build/bench/device/device_bench" ] || cmake --build "$build" --target device_bench -j2 >/dev/null
echo "### sim: 2 simulated devices"
TDIST_DEVICE=sim TDIST_SIM_DEVICES=2 "$build/bench/device/device_bench" "$@"
if TDIST_DEVICE=cuda "$build/bench/device/device_bench" "$@" > /tmp/device_bench_cuda.$$ 2>/tmp/device_bench_cuda_err.$$; then
  echo
  echo "### cuda"
  cat /tmp/device_bench_cuda.$$
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    python3 "$here/torch_device_bench.py" "$@"
  fi
else
  echo
  echo "(no CUDA device: $(cat /tmp/device_bench_cuda_err.$$))"
fi
rm -f /tmp/device_bench_cuda.$$ /tmp/device_bench_cuda_err.$$
