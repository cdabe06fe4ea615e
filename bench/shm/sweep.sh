#!/usr/bin/env bash
# bench/shm/sweep.sh: float32 all_reduce of tdist's shm backend (tdist-bench) against Open MPI's
# MPI_Allreduce (bench/peers/mpi_allreduce.c, vader with CMA), world sizes 2 and 4, over a fine
# sweep of sizes (2 to 48 MiB in 1 MiB steps by default, plus 8 B for the latency), written for a
# shared machine whose speed moves while it runs (issue 25, docs/performance.md "The 4-32 MiB
# sweep"):
#  - the two programs are interleaved per size, not per sweep: for every repeat, world and size,
#    one run of each back to back (tdist first on odd repeats, MPI first on even ones), so the two
#    numbers of a pair were taken within about a second of each other;
#  - each pair is preceded by a probe of how far apart the host has put the two CPUs (shm_xcore:
#    a cache line's round trip between them and the rate at which one reads what the other wrote),
#    which tags the state the pair ran in (docs/performance.md explains why it matters);
#  - the summary gives per size the best and the median of each program over the repeats, the
#    ratio of the medians, the median of the paired ratios, and both programs by probe state.
# Writes into bench/results/shm_sweep/ (or $RESULTS): sweep.csv (every run), sweep.md (the tables),
# sweep_busbw.png (median and best bus bandwidth against size), sweep_ratio.png (paired ratios).
#
#   bash bench/shm/sweep.sh [BUILD_DIR (build/plain)] [REPEATS (5)] [SECONDS per run (0.2)]
# Environment: WORLDS ("2 4"), MIN (2M), MAX (48M), STEP (1M), LATENCY (1: add the 8 B size),
# EXTRA_ENV (variables for tdist's ranks, e.g. "TDIST_SHM_SLOT=512K", to compare settings).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
reps=${2:-5}
secs=${3:-0.2}
worlds=${WORLDS:-2 4}
results=${RESULTS:-bench/results/shm_sweep}
bin=$build/tools/tdist-bench/tdist-bench
xcore=$build/bench/shm/shm_xcore
cmake --build "$build" --target tdist-bench shm_xcore >/dev/null

source bench/peers/setup.sh
mkdir -p "$results"

to_bytes() { numfmt --from=iec "$1"; }
min=$(to_bytes "${MIN:-2M}") max=$(to_bytes "${MAX:-48M}") step=$(to_bytes "${STEP:-1M}")
sizes=()
[ "${LATENCY:-1}" = 1 ] && sizes+=(8)
for ((s = min; s <= max; s += step)); do sizes+=("$s"); done

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src include 2>/dev/null || commit="$commit + uncommitted changes in src/ or include/"
extra=(${EXTRA_ENV:-})
csv=$results/sweep.csv
echo "rep,world,size,rtt_ns,xfer_gbs,impl,time_us,busbw_gbs,wrong" > "$csv"
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

one() { # impl world size -> "time_us,busbw_gbs,wrong"
  local args=(--min "$3" --max "$3" --time "$secs" --csv --no-header)
  case $1 in
    tdist) env "${extra[@]}" "$bin" --nproc "$2" --backend shm --op all_reduce --dtype f32 "${args[@]}" ;;
    openmpi) "${mpirun_cmd[@]}" -np "$2" "$mpibin" "${args[@]}" ;;
  esac | awk -F, '{print $9 "," $11 "," $12}'
}
for rep in $(seq "$reps"); do
  for w in $worlds; do
    for s in "${sizes[@]}"; do
      probe=$("$xcore")
      if [ $((rep % 2)) = 1 ]; then order="tdist openmpi"; else order="openmpi tdist"; fi
      for impl in $order; do
        echo "$rep,$w,$s,$probe,$impl,$(one "$impl" "$w" "$s")" >> "$csv"
      done
    done
    echo "bench/shm/sweep: repeat $rep, world $w done" >&2
  done
done

machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(. /etc/os-release; echo "$PRETTY_NAME"), $(uname -r)"
/usr/bin/python3 bench/shm/sweep_summary.py "$results" "$reps" "$secs" "$commit" "$machine" "$start" \
  "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" "${EXTRA_ENV:-}" "${mpirun_cmd[*]}"
