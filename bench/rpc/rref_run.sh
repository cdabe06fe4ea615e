#!/usr/bin/env bash
# bench/rpc/rref_run.sh: remote references between three worker processes, tdist (rref_bench)
# beside PyTorch's TorchRPC with TensorPipe from Debian's python3-torch (torch_rref_bench.py), in
# one run, on tdist's default same-host path and forced over TCP; prints the table that
# docs/performance.md ("RRefs against TorchRPC") shows and writes it with its raw numbers to
# bench/results/rpc/<LABEL>.md and .csv. Runs alternate between the two and repeat; the table gives
# each median.
#
#   bash bench/rpc/rref_run.sh [BUILD_DIR (build/plain)] [SECONDS per measurement (1)] [REPEATS (3)] [LABEL (rref)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
secs=${2:-1}
reps=${3:-3}
label=${4:-rref}
. bench/rpc/alternate.sh
rpc_alternate "$build" rref_bench "$secs" "$reps"
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
lines = ["RRefs between three worker processes on one host (median of %d runs; PyTorch %s TorchRPC with TensorPipe; %s cores)\n"
         % (max(len(v) for v in td.values()), sys.argv[3], sys.argv[4]),
         "| measurement | path | tdist (us) | TorchRPC (us) | tdist speed-up |", "| --- | --- | ---: | ---: | ---: |"]
csv = ["metric,path,impl,run,value"]
for impl, runs in (("tdist", td), ("torch", pt)):
    for k, vals in sorted(runs.items()):
        for i, v in enumerate(vals):
            csv.append("%s,%s,%s,%d,%s" % (k[0], k[1], impl, i, v))
for title, metric in (("remote() + to_here() + release", "remote_to_here_us"),
                      ("RRef passed to a third worker, which fetches it", "three_workers_us")):
    for path in ("samehost", "tcp"):
        a, b = med(td, (metric, path)), med(pt, (metric, path))
        if a is None:
            continue
        lines.append("| %s | %s | %.1f | %s | %s |" % (title, path, a, "" if b is None else "%.1f" % b,
                                                       "" if b is None else "%.2fx" % (b / a)))
lines.append("")
lines.append("tdist speed-up: TorchRPC's time / tdist's (above 1: tdist is faster).")
text = "\n".join(lines) + "\n"
print(text, end="")
open(sys.argv[5] + ".md", "w").write(text)
open(sys.argv[5] + ".csv", "w").write("\n".join(csv) + "\n")
PY
