#!/usr/bin/env bash
# bench/mpi: tdist's mpi backend against plain MPI_Allreduce, in one run. tdist-bench --backend mpi
# (float32 SUM all_reduce through td_pg_all_reduce: the front end, which runs a blocking call on the
# caller's thread, the backend, MPI) and bench/peers/mpi_allreduce.c (the same MPI_Allreduce called
# directly, measured the same way: tools/tdist-bench/measure.c) both run under <build>/tdist-mpiexec,
# the mpiexec and flags of the tests (cmake/TdistMpi.cmake), alternating so that a change of load
# hits both alike, REPEATS times per world size. Prints the overhead table of docs/performance.md
# ("mpi backend overhead"): the median over the repeats of each program's time per call, and the
# overhead over plain MPI. tdist runs in both collective modes: the default (blocking MPI calls, on
# the caller's thread or the group's worker) and TDIST_MPI_COLLECTIVES=nonblocking (MPI_Iallreduce,
# completed by spin-testing and the progress thread), at TDIST_MPI_THREAD_LEVEL=serialized, and at
# TDIST_MPI_THREAD_LEVEL=single (funneled mode: MPI called only on the thread that initialized it,
# the level a plain MPI_Init program runs at). The plain program also runs initialized at
# MPI_THREAD_MULTIPLE (the level tdist asks for by default), to show what that level alone costs.
# Then, because launches of one program differ by more than the overhead at small sizes, the
# same comparison inside one process (bench/mpi/mpi_ab.c: an MPI_Init program with a tdist group,
# alternating batches of MPI_Allreduce and td_pg_all_reduce), REPEATS launches per world size from
# MIN up to AB_MAX (MAX: every size of the launches).
#
# In one process the two sides of a launch form a pair, so the overhead there is the median over
# launches of each launch's own tdist / MPI - 1 (launches differ from each other by more than that);
# the table also gives its range and each side's median time.
#
#   bash bench/mpi/run.sh [BUILD_DIR (build/plain)] [REPEATS (3)] [SECONDS per size (0.3)]
# Environment: WORLDS ("2 4"), MIN (1K), MAX (64M), FACTOR (4), RESULTS (bench/results);
# REPORT_ONLY=1 runs nothing and prints the tables again from RESULTS's files.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
reps=${2:-3}
secs=${3:-0.3}
worlds=${WORLDS:-2 4}
min=${MIN:-1K}
max=${MAX:-64M}
factor=${FACTOR:-4}
results=${RESULTS:-bench/results}

if [ -z "${REPORT_ONLY:-}" ] && [ ! -x "$build/tdist-mpiexec" ]; then
  echo "bench/mpi: $build was configured without MPI (apt-get install libopenmpi-dev openmpi-bin, then re-run cmake); skipping" >&2
  exit 0
fi
mpiexec=$build/tdist-mpiexec
tdist=$build/tools/tdist-bench/tdist-bench
raw=$build/bench/mpi/mpi_allreduce
ab=$build/bench/mpi/mpi_ab
ab_max=${AB_MAX:-$max}
mkdir -p "$results"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

common=(--min "$min" --max "$max" --factor "$factor" --time "$secs" --csv --no-header)
run_one() { # impl world rep
  local impl=$1 w=$2 rep=$3 out="$tmp/$1.$2.$3.csv"
  case $impl in
    mpi) "$mpiexec" -n "$w" "$raw" "${common[@]}" > "$out" ;;
    mpi-mt) "$mpiexec" -n "$w" "$raw" --thread-multiple --impl openmpi-mt "${common[@]}" > "$out" ;;
    tdist) "$mpiexec" -n "$w" "$tdist" --backend mpi --impl tdist-mpi "${common[@]}" > "$out" ;;
    tdist-single) TDIST_MPI_THREAD_LEVEL=single "$mpiexec" -n "$w" "$tdist" --backend mpi --impl tdist-mpi-single \
                    "${common[@]}" > "$out" ;;
    tdist-ser) TDIST_MPI_THREAD_LEVEL=serialized "$mpiexec" -n "$w" "$tdist" --backend mpi --impl tdist-mpi-ser \
                 "${common[@]}" > "$out" ;;
    tdist-nb) TDIST_MPI_COLLECTIVES=nonblocking "$mpiexec" -n "$w" "$tdist" --backend mpi --impl tdist-mpi-nb \
                "${common[@]}" > "$out" ;;
  esac
  # The 13 columns both programs print (tdist-bench's placement and in-place columns after them
  # are N/A for all_reduce, which runs in place only and fills these).
  cut -d, -f1-13 "$out" | sed "s/\$/,$rep/" >> "$tmp/all.csv"
  echo "bench/mpi: $impl, world $w, run $rep: $(wc -l < "$out") sizes" >&2
}
if [ -z "${REPORT_ONLY:-}" ]; then
cmake --build "$build" --target tdist-bench bench_mpi_allreduce bench_mpi_ab >/dev/null
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$tmp/all.csv"
for rep in $(seq "$reps"); do
  for w in $worlds; do
    if [ $((rep % 2)) = 1 ]; then order="mpi mpi-mt tdist tdist-single tdist-ser tdist-nb"; else order="tdist-nb tdist-ser tdist-single tdist mpi-mt mpi"; fi
    for impl in $order; do run_one "$impl" "$w" "$rep"; done
  done
done
: > "$tmp/ab.csv"
for rep in $(seq "$reps"); do
  for w in $worlds; do
    "$mpiexec" -n "$w" "$ab" --min "$min" --max "$ab_max" --factor "$factor" --csv --no-header | sed "s/\$/,$rep/" >> "$tmp/ab.csv"
    echo "bench/mpi: mpi_ab, world $w, run $rep" >&2
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
{ echo "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,rep"; cat "$tmp/all.csv"; } \
  > "$results/mpi_overhead.csv"
{ echo "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,rep"; cat "$tmp/ab.csv"; } \
  > "$results/mpi_overhead_same_process.csv"
mpi_version=$("${MPIEXEC:-mpiexec}" --version 2>/dev/null | head -1 || true)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
machine="$(nproc) cores ($cpu), $(. /etc/os-release; echo "$PRETTY_NAME")"
flags=$(sed -n 's/^exec "\([^"]*\)" /\1 /p' "$mpiexec" | sed 's/ "\$@"$//')
# What the report needs besides the CSV files, for REPORT_ONLY.
declare -p reps secs mpi_version machine load_before load_after flags > "$results/mpi_overhead.env"
else
. "$results/mpi_overhead.env"
fi
python3 - "$results/mpi_overhead.csv" "$results/mpi_overhead_same_process.csv" "$reps" "$secs" "$mpi_version" "$machine" "$load_before" "$load_after" "$flags" <<'PY' | tee "$results/mpi_overhead.md"
import csv, statistics, sys
path, ab_path, reps, secs, mpi_v, machine, load0, load1, flags = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
t = {}
for r in rows:
    if int(r["wrong"]) != 0:
        sys.exit("bench/mpi: %s reported %s wrong elements at %s bytes" % (r["impl"], r["wrong"], r["size"]))
    t.setdefault((r["impl"], int(r["world"]), int(r["size"])), []).append(float(r["time_us"]))
def size_name(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return "%g %s" % (b / n, unit)
    return "%d B" % b
print("Machine: %s. %s; `%s`. Load average %s before, %s after. Median of %s runs, %s s of calls per size."
      % (machine, mpi_v, flags, load0, load1, reps, secs))
for w in sorted({int(r["world"]) for r in rows}):
    print()
    print("World size %d (float32 SUM, time per call in microseconds; overhead = tdist / MPI - 1):" % w)
    print()
    print("| size | MPI_Allreduce | MPI_Allreduce, MPI_THREAD_MULTIPLE | overhead | tdist mpi | overhead "
          "| tdist mpi, single | overhead | tdist mpi, serialized | overhead | tdist mpi, nonblocking | overhead |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    fmt = lambda v: "%.2f" % v if v < 10 else "%.1f" % v
    for size in sorted({int(r["size"]) for r in rows if int(r["world"]) == w}):
        base = statistics.median(t[("openmpi", w, size)])
        cells = [fmt(base)]
        for impl in ("openmpi-mt", "tdist-mpi", "tdist-mpi-single", "tdist-mpi-ser", "tdist-mpi-nb"):
            v = statistics.median(t[(impl, w, size)])
            cells += [fmt(v), "%+.1f%%" % (100 * (v / base - 1))]
        print("| %s | %s |" % (size_name(size), " | ".join(cells)))
ab = {}
for r in csv.DictReader(open(ab_path)):
    ab.setdefault((r["impl"], int(r["world"]), int(r["size"])), {})[int(r["rep"])] = float(r["time_us"])
for w in sorted({k[1] for k in ab}):
    print()
    print("World size %d, in one process (mpi_ab: MPI_Init, tdist in funneled mode; each launch's median per "
          "side; overhead and added time: the median over launches of each launch's own):" % w)
    print()
    print("| size | MPI_Allreduce | td_pg_all_reduce | overhead | range over launches | added per call (us) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sorted({k[2] for k in ab if k[1] == w}):
        m, t = ab[("mpi-same", w, size)], ab[("tdist-same", w, size)]
        ms, ts = [m[k] for k in sorted(m)], [t[k] for k in sorted(m)]  # paired by launch
        over = [100 * (b / a - 1) for a, b in zip(ms, ts)]
        print("| %s | %.2f | %.2f | %+.1f%% | %+.1f%% .. %+.1f%% | %.2f |"
              % (size_name(size), statistics.median(ms), statistics.median(ts), statistics.median(over),
                 min(over), max(over), statistics.median([b - a for a, b in zip(ms, ts)])))
PY
