#!/usr/bin/env bash
# bench/rpc/large_floor.sh: a large tensor round trip against what the path alone costs. For each
# path (forced TCP, then one host), in alternating rounds: the raw ping-pong of a message of BYTES
# between two processes (rpc_bench --floor: no RPC at all), tdist's rpc_sync round trip of a
# float32 tensor of BYTES, and TorchRPC's (torch_rpc_bench.py, Debian's python3-torch); medians
# of SECONDS each. Writes the lines to bench/results/rpc/<LABEL>.txt.
#
#   bash bench/rpc/large_floor.sh [BUILD_DIR (build/plain)] [BYTES (16777216)] [ROUNDS (3)] [SECONDS (1)] [LABEL (large_floor)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
bytes=${2:-16777216}
rounds=${3:-3}
secs=${4:-1}
label=${5:-large_floor}
. bench/rpc/alternate.sh
rpc_need_torch
bench=$build/bench/rpc/rpc_bench
out=bench/results/rpc/$label.txt
mkdir -p bench/results/rpc
{
  echo "# $(date -u +%FT%TZ) at $(git rev-parse --short HEAD): bash bench/rpc/large_floor.sh $build $bytes $rounds $secs $label"
  for r in $(seq 1 "$rounds"); do
    echo "## round $r"
    for path in tcp samehost; do
      flag=""
      [ "$path" = tcp ] && flag=--tcp
      "$bench" $flag --floor "$bytes" --seconds "$secs"
      "$bench" $flag --no-pingpong --sizes "$bytes" --seconds "$secs" | grep '^tensor_us'
      $py bench/rpc/torch_rpc_bench.py $flag --sizes "$bytes" --seconds "$secs" 2>/dev/null | grep '^tensor_us' |
        sed 's/^/torch_/'
    done
  done
} | tee "$out"
