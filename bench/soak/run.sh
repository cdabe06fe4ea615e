#!/usr/bin/env bash
# bench/soak/run.sh: the soak run (make soak). tdist-soak on 4 ranks for MINUTES on each backend:
# tcp, shm and auto under tdrun, mpi under <build>/tdist-mpiexec (cmake/TdistMpi.cmake; skipped
# when the build has no MPI), threaded as 4 rank threads of one process. Prints one table (steps,
# GB moved, steps/s, each rank's RSS growth after the warm-up, result) and writes it, with every
# run's output, to RESULTS/soak_<date>_<commit>.{md,log}. Exit status 1 when any backend failed.
#
#   bash bench/soak/run.sh [BUILD_DIR (build/plain)] [MINUTES (30)] [BACKENDS... (tcp shm auto mpi threaded)]
# Environment: RESULTS (bench/results/soak), SEED (each run's own, printed, by default),
# SOAK_ARGS (more tdist-soak flags, e.g. "--max-growth-mib 128"), TDIST_STORAGE_CACHE (0 here
# unless set: the RSS check looks for leaks, and the freed blocks a process keeps for reuse, up to
# 128 MiB by default, would move its RSS by tens of MiB either way; tests/base/test_hugealloc.c
# checks that cache's bound).
set -euo pipefail
export TDIST_STORAGE_CACHE=${TDIST_STORAGE_CACHE:-0}
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
minutes=${2:-30}
shift $(( $# < 2 ? $# : 2 ))
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(tcp shm auto mpi threaded)
results=${RESULTS:-bench/results/soak}
soak=$build/bench/soak/tdist-soak
tdrun=$build/tools/tdrun/tdrun
for b in "$soak" "$tdrun"; do
  [ -x "$b" ] || { echo "bench/soak: $b is missing (make build)" >&2; exit 1; }
done
extra=(--minutes "$minutes" ${SEED:+--seed "$SEED"} ${SOAK_ARGS:-})

stamp=$(date +%Y-%m-%d_%H%M)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$results"
log=$results/soak_${stamp}_${commit}.log
table=$results/soak_${stamp}_${commit}.md
: > "$log"

status=0
for b in "${backends[@]}"; do
  echo "bench/soak: $b, $minutes minutes" >&2
  out=$(mktemp)
  case $b in
    threaded) cmd=("$soak" --backend threaded --nproc 4 "${extra[@]}") ;;
    mpi)
      if [ ! -x "$build/tdist-mpiexec" ]; then
        echo "bench/soak: $build was configured without MPI (scripts/deps.sh installs Open MPI; then re-run cmake); skipping mpi" >&2
        echo "SOAK backend=mpi result=skipped" >> "$log"
        continue
      fi
      cmd=("$build/tdist-mpiexec" -n 4 "$soak" --backend mpi "${extra[@]}") ;;
    *) cmd=("$tdrun" --standalone --nproc-per-node 4 "$soak" --backend "$b" "${extra[@]}") ;;
  esac
  echo "\$ ${cmd[*]}" >> "$log"
  rc=0
  "${cmd[@]}" > "$out" 2>&1 || rc=$?
  cat "$out" >> "$log"
  # a run that died before its summary lines still gets a row
  grep -q "SOAK rank=" "$out" || echo "SOAK rank=? backend=$b result=exit_$rc" >> "$log"
  [ "$rc" -eq 0 ] || status=1
  grep "SOAK FAIL" "$out" | head -3 >&2 || true
  rm -f "$out"
done

python3 - "$log" "$minutes" "$commit" > "$table" <<'PY'
import re, sys
log, minutes, commit = sys.argv[1:4]
runs = {}
for line in open(log):
    m = re.search(r"SOAK (rank=.*)", line)
    if not m:
        continue
    f = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    runs.setdefault(f.get("backend", "?"), []).append(f)
print(f"Soak run, {minutes} minutes per backend, 4 ranks, commit {commit}. Growth: RSS at the end minus RSS")
print("after the warm-up (the first 10% of the run), per rank, KiB. GB: bytes of every rank's tensors handed")
print("to the collectives, summed over the ranks.\n")
print("| backend | seed | steps | GB moved | steps/s | RSS growth per rank (KiB) | RSS at the end per rank (MiB) | result |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for b, rows in runs.items():
    rows = sorted(rows, key=lambda f: f.get("rank", "?"))
    ok = [f for f in rows if "steps" in f]
    results = sorted({f.get("result", "?") for f in rows})
    result = "ok" if results == ["ok"] and len(ok) == 4 else ",".join(r for r in results if r != "ok") or "incomplete"
    if not ok:
        print(f"| {b} | | | | | | | {result} |")
        continue
    steps = ok[0]["steps"]
    gb = sum(float(f["bytes"]) for f in ok) / 1e9
    rate = min(float(f["steps_per_s"]) for f in ok)
    growth = " / ".join(f["growth_kib"] for f in ok)
    end = " / ".join(f"{int(f['rss_end_kib']) / 1024:.0f}" for f in ok)
    print(f"| {b} | {ok[0]['seed']} | {steps} | {gb:.1f} | {rate:.0f} | {growth} | {end} | {result} |")
PY
cat "$table"
echo "bench/soak: wrote $table and $log" >&2
exit $status
