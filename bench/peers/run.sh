#!/usr/bin/env bash
# bench/peers: all_reduce (float32 SUM) of tdist's tcp backend (tdist-bench) beside Gloo (torch.distributed
# from Debian's python3-torch, gloo_allreduce.py) and Open MPI (mpi_allreduce.c), in one run, for
# world sizes 2 and 4, 8 B to 64 MiB. All three measure the same way (tools/tdist-bench/measure.c)
# and print the same CSV columns. Runs alternate between the three and repeat; the tables give the
# median over the repeats of each program's time. Writes into bench/results/ (or $RESULTS):
#   allreduce_peers.md            the comparison tables (markdown), with the machine and load
#   allreduce_peers.csv           every row of every run
#   allreduce_busbw.png           bus bandwidth against size (log-log, gnuplot)
#   allreduce_latency.png         time per call against size (log-log)
#
#   bash bench/peers/run.sh [BUILD_DIR (build/plain)] [REPEATS (3)] [SECONDS per size (0.3)]
# Environment: WORLDS ("2 4"), MIN (8), MAX (64M), BACKEND (tcp), RESULTS (bench/results).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
reps=${2:-3}
secs=${3:-0.3}
worlds=${WORLDS:-2 4}
min=${MIN:-8}
max=${MAX:-64M}
backend=${BACKEND:-tcp}
results=${RESULTS:-bench/results}

bin=$build/tools/tdist-bench/tdist-bench
cmake --build "$build" --target tdist-bench >/dev/null # the tdist measured is the tree's

# The peers (installed when missing), mpi_allreduce built, and how mpirun starts it.
source bench/peers/setup.sh
mkdir -p "$results"

# The tdist the build was made from (read before the runs: others may commit meanwhile).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src include 2>/dev/null || commit="$commit + uncommitted changes in src/ or include/"

common=(--min "$min" --max "$max" --time "$secs" --csv --no-header)
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,rep" > "$raw/all.csv"
run_one() { # impl world rep
  local impl=$1 w=$2 rep=$3 out="$raw/$1.$2.$3.csv"
  case $impl in
    tdist) "$bin" --nproc "$w" --backend "$backend" --op all_reduce --dtype f32 "${common[@]}" > "$out" ;;
    gloo) $py bench/peers/gloo_allreduce.py --nproc "$w" "${common[@]}" > "$out" ;;
    mpi) "${mpirun_cmd[@]}" -np "$w" "$mpibin" "${common[@]}" > "$out" ;;
  esac
  # The 13 columns all three print; tdist-bench's placement and in-place columns after them are
  # N/A for all_reduce, which runs in place only and fills these.
  cut -d, -f1-13 "$out" | sed "s/\$/,$rep/" >> "$raw/all.csv"
  echo "bench/peers: $impl, world $w, run $rep: $(wc -l < "$out") sizes" >&2
}
for rep in $(seq "$reps"); do
  for w in $worlds; do
    # Alternate the order so that a change of load hits every program alike.
    if [ $((rep % 2)) = 1 ]; then order="tdist gloo mpi"; else order="mpi gloo tdist"; fi
    for impl in $order; do run_one "$impl" "$w" "$rep"; done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cp "$raw/all.csv" "$results/allreduce_peers.csv"

torch_version=$($py -c 'import torch; print(torch.__version__)')
mpi_version=$(mpirun --version 2>/dev/null | head -1)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
buildtype=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)
machine="$(nproc) cores ($cpu), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release; echo "$PRETTY_NAME"), $(uname -r)"

$py - "$results" "$reps" "$secs" "$backend" "$torch_version" "$mpi_version" "$machine" "$load_before" "$load_after" "$start" "${mpirun_cmd[*]}" "$commit" "$buildtype" <<'PY'
import csv, os, statistics, sys
sys.path.insert(0, "bench/peers")
from tables import busbw, human
results, reps, secs, backend, torch_v, mpi_v, machine, load0, load1, start, mpirun, commit, buildtype = sys.argv[1:]
rows = list(csv.DictReader(open(os.path.join(results, "allreduce_peers.csv"))))
impls = [("tdist-" + backend, "tdist " + backend), ("gloo", "Gloo"), ("openmpi", "Open MPI")]
med, wrong = {}, {}
for r in rows:
    k = (r["impl"], int(r["world"]), int(r["size"]))
    med.setdefault(k, []).append(float(r["time_us"]))
    wrong[k] = wrong.get(k, 0) + (int(r["wrong"]) if r["wrong"] not in ("N/A", "") else 0)
per_rep = {(r["impl"], int(r["world"]), int(r["size"]), r["rep"]): float(r["time_us"]) for r in rows}
med = {k: statistics.median(v) for k, v in med.items()}

def rep_range(n, size):
    """The lowest and highest Gloo/tdist time ratio over the runs of one size."""
    ratios = [per_rep[("gloo", n, size, rep)] / per_rep[(impls[0][0], n, size, rep)]
              for (i, w, s, rep) in per_rep if i == impls[0][0] and w == n and s == size
              and ("gloo", n, size, rep) in per_rep]
    return "%.2f-%.2f" % (min(ratios), max(ratios)) if ratios else "-"
worlds = sorted({k[1] for k in med})
sizes = sorted({k[2] for k in med})

def fmt_bw(x):
    return "%.3f" % x if x < 10 else "%.2f" % x

out = []
out.append("all_reduce, float32 SUM, in place. Time per call in µs (median over %s runs of each program's "
           "median over batches of the slowest rank's mean), bus bandwidth in GB/s (nccl-tests: "
           "size / time x 2(n-1)/n). \"x Gloo\" and \"x MPI\" are tdist's speed over each (their time / "
           "tdist's time, which is also the bus-bandwidth ratio)." % reps)
out.append("")
out.append("- started %s; %s s of calls per size; load average %s before, %s after" % (start, secs, load0, load1))
out.append("- machine: %s" % machine)
out.append("- tdist: commit %s, %s build" % (commit, buildtype or "unknown"))
out.append("- peers: Gloo from torch %s (python3-torch, CPU tensors, blocking dist.all_reduce); %s, `%s`"
           % (torch_v, mpi_v, mpirun))
all_wrong = sum(wrong.values())
out.append("- wrong elements over every checked call: %d" % all_wrong)
out.append("")
targets = []
for n in worlds:
    out.append("### World size %d" % n)
    out.append("")
    out.append("| size | tdist µs | Gloo µs | MPI µs | tdist GB/s | Gloo GB/s | MPI GB/s | x Gloo | x MPI |")
    out.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in sizes:
        t = [med.get((i, n, s)) for i, _ in impls]
        if t[0] is None:
            continue
        cells = [human(s)]
        cells += ["%.1f" % x if x is not None else "-" for x in t]
        cells += [fmt_bw(busbw(x, s, n)) if x is not None else "-" for x in t]
        cells += ["%.2f" % (x / t[0]) if x is not None else "-" for x in t[1:]]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    g16, t16 = med.get(("gloo", n, 16 << 20)), med.get((impls[0][0], n, 16 << 20))
    g8, t8 = med.get(("gloo", n, 8)), med.get((impls[0][0], n, 8))
    if g16 and t16:
        targets.append("| %d | 16 MiB bus bandwidth | %s GB/s | %s GB/s | %.2fx | %s | at least 2x | %s |"
                       % (n, fmt_bw(busbw(t16, 16 << 20, n)), fmt_bw(busbw(g16, 16 << 20, n)), g16 / t16,
                          rep_range(n, 16 << 20), "met" if g16 / t16 >= 2 else "missed"))
    if g8 and t8:
        targets.append("| %d | 8 B latency | %.1f µs | %.1f µs | %.2fx | %s | at least 4x (a quarter of Gloo's) | %s |"
                       % (n, t8, g8, g8 / t8, rep_range(n, 8), "met" if g8 / t8 >= 4 else "missed"))
out.append("### Targets against Gloo")
out.append("")
out.append("| world | measure | tdist | Gloo | tdist's advantage | range over the runs | target | |")
out.append("| ---: | --- | ---: | ---: | ---: | ---: | --- | --- |")
out += targets
out.append("")
open(os.path.join(results, "allreduce_peers.md"), "w").write("\n".join(out))
print("\n".join(out))

# gnuplot data: one file per (impl, world): size time busbw
for i, _ in impls:
    for n in worlds:
        with open(os.path.join(results, ".plot_%s_%d.dat" % (i, n)), "w") as f:
            for s in sizes:
                if (i, n, s) in med:
                    f.write("%d %.6f %.6f\n" % (s, med[(i, n, s)], busbw(med[(i, n, s)], s, n)))
PY

plot() { # column ylabel file title
  local col=$1 ylabel=$2 file=$3 title=$4 lines="" first=1
  local -A color=([tdist-$backend]='#d62728' [gloo]='#1f77b4' [openmpi]='#2ca02c')
  local -A name=([tdist-$backend]="tdist $backend" [gloo]='Gloo' [openmpi]='Open MPI')
  for impl in tdist-$backend gloo openmpi; do
    for w in $worlds; do
      local dat="$results/.plot_${impl}_$w.dat"
      [ -s "$dat" ] || continue
      local dt=1; [ "$w" = 4 ] && dt=2
      [ $first = 1 ] || lines+=", "
      first=0
      lines+="'$dat' using 1:$col with linespoints lw 2 pt 7 ps 0.6 dt $dt lc rgb '${color[$impl]}' title '${name[$impl]}, world $w'"
    done
  done
  gnuplot <<EOF
set terminal pngcairo size 1000,640 font ",11"
set output '$file'
set title '$title' noenhanced
set logscale xy 2
set logscale y 10
set format y '%g'
set xlabel 'size (bytes)'
set ylabel '$ylabel'
set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216, '64M' 67108864)
set grid xtics ytics mytics
set key top left
plot $lines
EOF
}
plot 3 'bus bandwidth (GB/s)' "$results/allreduce_busbw.png" "all_reduce float32: bus bandwidth against size ($(nproc) cores)"
plot 2 'time per call (µs)' "$results/allreduce_latency.png" "all_reduce float32: time per call against size ($(nproc) cores)"
rm -f "$results"/.plot_*.dat
echo "bench/peers: wrote $results/allreduce_peers.md, allreduce_peers.csv, allreduce_busbw.png, allreduce_latency.png" >&2
