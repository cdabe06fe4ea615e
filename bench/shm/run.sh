#!/usr/bin/env bash
# bench/shm: float32 all_reduce from 8 B to 64 MiB on one host, world sizes 2 and 4, in one
# invocation: tdist's shm backend through td_pg_all_reduce (tdist-bench), the same backend without
# the process-group front end (shm_coll_bench), Open MPI (its shared-memory path, vader) and Gloo
# (torch.distributed from Debian's python3-torch), plus the machine's memory bandwidth (shm_membw:
# memcpy and read-add-write with 1 thread and with every CPU). The peers and tdist-bench run
# through bench/peers/run.sh (the same measuring loop for all), one round per repeat after the
# backend alone; the tables give medians over the repeats. Prints the table of
# docs/performance.md, "Collectives on one host", and writes it into bench/results/shm/ (or
# $RESULTS), with the raw CSVs.
# Environment: MIN (8), MAX (64M).
#
#   bash bench/shm/run.sh [BUILD_DIR (build/plain)] [REPEATS (3)] [SECONDS per size (0.3)]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
reps=${2:-3}
secs=${3:-0.3}
results=${RESULTS:-bench/results/shm}
py=/usr/bin/python3
mkdir -p "$results"
cmake --build "$build" --target tdist-bench shm_coll_bench shm_membw >/dev/null

# The memory bandwidth first, while nothing of ours runs.
"$build/bench/shm/shm_membw" 64 10 | grep -v '^#' > "$results/membw.csv"

# Each repeat runs the backend alone, then one round of bench/peers (tdist-bench on shm, Gloo and
# Open MPI, in alternating order), so that a change of load on the machine hits all of them alike.
: > "$results/backend.csv"
echo "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,rep" > "$results/allreduce_peers.csv"
for rep in $(seq "$reps"); do
  for w in 2 4; do
    "$build/bench/shm/shm_coll_bench" -n "$w" --min "${MIN:-8}" --max "${MAX:-64M}" --time "$secs" | grep -v '^impl' |
      sed "s/\$/,$rep/" >> "$results/backend.csv"
    echo "bench/shm: shm backend alone, world $w, run $rep" >&2
  done
  BACKEND=shm RESULTS="$results/round$rep" WORLDS="2 4" MIN="${MIN:-8}" MAX="${MAX:-64M}" \
    bash bench/peers/run.sh "$build" 1 "$secs" >/dev/null
  tail -n +2 "$results/round$rep/allreduce_peers.csv" | sed 's/,[0-9]*$//' | sed "s/\$/,$rep/" >> "$results/allreduce_peers.csv"
  rm -rf "$results/round$rep"
done

$py bench/shm/summarize.py "$results" "$reps"
