#!/usr/bin/env bash
# bench/store: TCPStore round trips per second, tdist (store_bench) beside PyTorch's TCPStore from
# Debian's python3-torch (torch_store_bench.py), in one run, with 1 and 16 clients; prints the
# table that docs/performance.md ("Stores") shows. Runs alternate between the two and repeat, and
# the table gives each median, so that load from other programs hits both alike.
#
#   bash bench/store/run.sh [BUILD_DIR (build/plain)] [SECONDS per run (2)] [REPEATS (3)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
secs=${2:-2}
reps=${3:-3}
bin=$build/bench/store/store_bench
[ -x "$bin" ] || { echo "bench/store: $bin is missing (make build)" >&2; exit 1; }
py=/usr/bin/python3
if ! $py -c 'import torch.distributed' 2>/dev/null; then
  echo "bench/store: installing python3-torch (Debian) for the PyTorch TCPStore peer" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y python3-torch >/dev/null
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$reps"); do
  for c in 1 16; do
    "$bin" --clients "$c" --seconds "$secs" >> "$out/tdist"
    $py bench/store/torch_store_bench.py --clients "$c" --seconds "$secs" >> "$out/torch"
  done
done
torch_version=$($py -c 'import torch; print(torch.__version__)')
$py - "$out/tdist" "$out/torch" "$torch_version" "$(nproc)" <<'PY'
import statistics, sys
def load(path):
    runs = {}
    for line in open(path):
        op, clients, rate = line.split()
        runs.setdefault((op, int(clients)), []).append(float(rate))
    return {k: statistics.median(v) for k, v in runs.items()}
td, pt = load(sys.argv[1]), load(sys.argv[2])
print("TCPStore round trips per second (median of runs; PyTorch %s; %s cores)\n" % (sys.argv[3], sys.argv[4]))
print("| operation | clients | tdist ops/s | PyTorch ops/s | tdist / PyTorch |")
print("| --- | ---: | ---: | ---: | ---: |")
for clients in (1, 16):
    for op in ("set", "get", "add", "wait"):
        k = (op, clients)
        if k in td and k in pt:
            print("| %s | %d | %.0f | %.0f | %.2fx |" % (op, clients, td[k], pt[k], td[k] / pt[k]))
PY
