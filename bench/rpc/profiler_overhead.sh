#!/usr/bin/env bash
# bench/rpc/profiler_overhead.sh: what the RPC profiler (tdist/profiler.h) costs per call, in one
# run: the empty rpc_sync round trip of rpc_bench built from a tree without the profiler
# (BEFORE), the same with the profiler built in but not running (AFTER, "disabled"), and with it
# running on the calling thread (AFTER --profile, "enabled"). The builds alternate, REPEATS times;
# prints the medians and the differences.
#
#   bash bench/rpc/profiler_overhead.sh BUILD_BEFORE BUILD_AFTER [REPEATS (5)] [SECONDS (1)]
set -euo pipefail
before=${1:?BUILD_BEFORE}
after=${2:?BUILD_AFTER}
reps=${3:-5}
secs=${4:-1}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$reps"); do
  for path in "" --tcp; do
    "$before/bench/rpc/rpc_bench" $path --no-pingpong --sizes 1024 --seconds "$secs" | sed -n 's/^empty_us /before /p' >> "$out"
    "$after/bench/rpc/rpc_bench" $path --no-pingpong --sizes 1024 --seconds "$secs" --profile |
      sed -n -e 's/^empty_us /disabled /p' -e 's/^empty_profiled_us /enabled /p' >> "$out"
  done
done
python3 - "$out" "$reps" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kind, path, v = line.split()
    runs.setdefault((kind, path), []).append(float(v))
print("Empty rpc_sync round trip, median of %s alternating runs (us)\n" % sys.argv[2])
print("| path | before (no profiler code) | profiler disabled | profiler enabled | disabled - before | enabled - disabled |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for path in ("samehost", "tcp"):
    b, d, e = (statistics.median(runs[(k, path)]) for k in ("before", "disabled", "enabled"))
    print("| %s | %.1f | %.1f | %.1f | %+.1f | %+.1f |" % (path, b, d, e, d - b, e - d))
PY
