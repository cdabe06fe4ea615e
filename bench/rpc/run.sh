#!/usr/bin/env bash
# bench/rpc: RPC between two worker processes, tdist (rpc_bench) beside PyTorch's TorchRPC with
# TensorPipe from Debian's python3-torch (torch_rpc_bench.py), in one run, on tdist's default
# same-host path and forced over TCP (tcp_only; TensorPipe restricted to its uv transport and basic
# channel); prints the table that docs/performance.md ("RPC against TorchRPC") shows and writes it
# with its raw numbers to bench/results/rpc/<LABEL>.md and .csv. Runs alternate between the two
# and repeat, and the table gives each median, so that load from other programs hits both alike.
#
#   bash bench/rpc/run.sh [BUILD_DIR (build/plain)] [SECONDS per measurement (1)] [REPEATS (3)] [LABEL (rpc)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
secs=${2:-1}
reps=${3:-3}
label=${4:-rpc}
. bench/rpc/alternate.sh
rpc_alternate "$build" rpc_bench "$secs" "$reps"
$py - "$out/tdist" "$out/torch" "$torch_version" "$(nproc)" "bench/results/rpc/$label" <<'PY'
import statistics, sys
def load(path):
    runs = {}
    for line in open(path):
        f = line.split()
        runs.setdefault(tuple(f[:-1]), []).append(float(f[-1]))
    return runs
td, pt = load(sys.argv[1]), load(sys.argv[2])
med = lambda runs, k: statistics.median(runs[k]) if k in runs else None
lines = []
lines.append("RPC between two worker processes on one host (median of %d runs; PyTorch %s TorchRPC with TensorPipe; %s cores)\n"
             % (max(len(v) for v in td.values()), sys.argv[3], sys.argv[4]))
lines.append("| measurement | path | tdist | TorchRPC | tdist speed-up |")
lines.append("| --- | --- | ---: | ---: | ---: |")
def fmt_size(b):
    b = int(b)
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)
rows = []
for path in ("samehost", "tcp"):
    rows.append(("empty rpc_sync round trip (us)", path, ("empty_us", path), False))
    rows.append(("rpc_async, 64 in flight (calls/s)", path, ("async_calls_per_s", path), True))
    sizes = sorted({int(k[2]) for k in td if k[0] == "tensor_us" and k[1] == path})
    for b in sizes:
        rows.append(("tensor round trip %s (us)" % fmt_size(b), path, ("tensor_us", path, str(b)), False))
csv = ["metric,path,bytes,impl,run,value"]
for impl, runs in (("tdist", td), ("torch", pt)):
    for k, vals in sorted(runs.items()):
        for i, v in enumerate(vals):
            csv.append("%s,%s,%s,%s,%d,%s" % (k[0], k[1], k[2] if len(k) > 2 else "", impl, i, v))
for title, path, k, higher in rows:
    a, b = med(td, k), med(pt, k)
    if a is None:
        continue
    ratio = "" if b is None else "%.2fx" % ((a / b) if higher else (b / a))
    lines.append("| %s | %s | %s | %s | %s |" % (title, path, "%.1f" % a if a < 1000 else "%.0f" % a,
                                               "" if b is None else ("%.1f" % b if b < 1000 else "%.0f" % b), ratio))
lines.append("")
lines.append("Raw ping-pong of one 88-byte message between two processes (the floor under any RPC), median us:")
lines.append("")
lines.append("| path | ping-pong (us) | tdist empty rpc_sync / ping-pong |")
lines.append("| --- | ---: | ---: |")
for path, what in (("samehost", "UNIX-domain socket pair"), ("tcp", "TCP loopback, TCP_NODELAY")):
    p, e = med(td, ("pingpong_us", path)), med(td, ("empty_us", path))
    if p is not None and e is not None:
        lines.append("| %s (%s) | %.1f | %.2fx |" % (path, what, p, e / p))
lines.append("")
lines.append("tdist speed-up: TorchRPC's time / tdist's for round trips, tdist's rate / TorchRPC's for throughput (above 1: tdist is faster).")
lines.append("")
lines.append("Targets of issue 18:")
lines.append("")
lines.append("| target | measured | met |")
lines.append("| --- | ---: | --- |")
def target(desc, value, ok, unit):
    if value is not None:
        lines.append("| %s | %s | %s |" % (desc, unit % value, "yes" if ok(value) else "no"))
e = med(td, ("empty_us", "samehost"))
target("empty round trip on one host <= 5 us", e, lambda v: v <= 5, "%.1f us")
e, p = med(td, ("empty_us", "tcp")), med(td, ("pingpong_us", "tcp"))
if e is not None and p is not None:
    target("empty round trip over TCP within 2x of the raw TCP ping-pong", e / p, lambda v: v <= 2, "%.2fx")
for path in ("samehost", "tcp"):
    a, b = med(td, ("async_calls_per_s", path)), med(pt, ("async_calls_per_s", path))
    if a is not None and b is not None:
        target("rpc_async throughput >= 20x TorchRPC (%s)" % path, a / b, lambda v: v >= 20, "%.1fx")
    a, b = med(td, ("tensor_us", path, str(16 << 20))), med(pt, ("tensor_us", path, str(16 << 20)))
    if a is not None and b is not None:
        target("16 MiB round trip >= 3x TorchRPC (%s)" % path, b / a, lambda v: v >= 3, "%.2fx")
text = "\n".join(lines) + "\n"
print(text, end="")
open(sys.argv[5] + ".md", "w").write(text)
open(sys.argv[5] + ".csv", "w").write("\n".join(csv) + "\n")
PY
