#!/usr/bin/env bash
# How fast a job notices a dead or a stopped rank (issue 23): runs test_pg_fail's two cases N times
# per backend and summarizes what the survivors printed.
#   peer_killed_mid_all_reduce: rank 2 of 3 SIGKILLs itself while the others wait in an all_reduce;
#     KILL_LATENCY is each survivor's time from the kill to its TD_ERR_PEER_LOST.
#   peer_stopped_hits_the_timeout: rank 1 of 2 SIGSTOPs itself; STOP_TIMEOUT is rank 0's time to
#     the watchdog's timeout error (group timeout 2000 ms).
# usage: bench/faults/kill_stop.sh [BUILD_DIR=build/plain] [N=10]
set -euo pipefail
build=${1:-build/plain}
n=${2:-10}
bin="$build/tests/pg/test_pg_fail"
[ -x "$bin" ] || { echo "no $bin: build first (make build)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# (A name selects every instance it begins, so "auto" also runs auto2x2: that is 2 ranks per node
# on 2 "nodes", tcp between them, and its lines count under auto.)
for b in tcp shm auto; do
  for _ in $(seq "$n"); do
    "$bin" "peer_killed_mid_all_reduce/$b" 2>&1 | grep -o 'KILL_LATENCY.*' >>"$out" || true
    "$bin" "peer_stopped_hits_the_timeout/$b" 2>&1 | grep -o 'STOP_TIMEOUT.*' >>"$out" || true
  done
done
python3 - "$out" "$n" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) backend=(\w+).* ms=(\d+)', line)
    if m:
        rows.setdefault((m.group(1), m.group(2)), []).append(int(m.group(3)))
print(f"| what | backend | samples | min ms | median ms | max ms |")
print(f"| --- | --- | --- | --- | --- | --- |")
for (what, b), v in sorted(rows.items()):
    label = "SIGKILL -> TD_ERR_PEER_LOST (each survivor)" if what == "KILL_LATENCY" else "SIGSTOP -> timeout error (timeout 2000 ms)"
    print(f"| {label} | {b} | {len(v)} | {min(v)} | {statistics.median(v):g} | {max(v)} |")
PY
