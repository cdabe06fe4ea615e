#!/usr/bin/env bash
# bench/shm: float32 all_reduce from 8 B to 64 MiB on one host, world sizes 2 and 4, in one
# invocation: tdist's shm backend through td_pg_all_reduce (tdist-bench), the same backend without
# the process-group front end (shm_coll_bench), Open MPI (its shared-memory path, vader) and Gloo
# (torch.distributed from Debian's python3-torch), plus the machine's memory bandwidth (shm_membw:
# memcpy and read-add-write with 1 thread and with every CPU). The peers and tdist-bench run
# through bench/peers/run.sh (the same measuring loop for all), one round per repeat after the
# backend alone; the tables give medians over the repeats. Prints the table of
# docs/performance.md, "Collectives on one host", and writes it into bench/results/shm/ (or
# $RESULTS), with the raw CSVs (each round's plots are in round<N>/).
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
done

$py - "$results" "$reps" <<'PY'
import csv, os, statistics, sys
results, reps = sys.argv[1], sys.argv[2]
cols = "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,rep".split(",")
rows = list(csv.DictReader(open(os.path.join(results, "allreduce_peers.csv"))))
rows += [dict(zip(cols, l.strip().split(","))) for l in open(os.path.join(results, "backend.csv")) if l.strip()]
times = {}
for r in rows:
    times.setdefault((r["impl"], int(r["world"]), int(r["size"])), []).append(float(r["time_us"]))
med = {k: statistics.median(v) for k, v in times.items()}
mem = {}
for l in open(os.path.join(results, "membw.csv")):
    loop, threads, operand, traffic = l.strip().split(",")
    mem[(loop, int(threads))] = (float(operand), float(traffic))
cpus = max(t for _, t in mem)

def busbw(us, size, n):
    return size / (us * 1e-6) / 1e9 * 2 * (n - 1) / n

def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return "%g %s" % (b / f, unit)
    return "%d B" % b

impls = ["tdist-shm", "tdist-shm-backend", "openmpi", "gloo"]
out = ["float32 all_reduce (SUM, in place), one host. Time per call in µs (median over %s runs of each "
       "program's median over batches of the slowest rank's mean); bus bandwidth in GB/s (nccl-tests: size / "
       "time x 2(n-1)/n). \"tdist shm\" is td_pg_all_reduce on the shm backend (tdist-bench); \"backend alone\" "
       "calls the shared-memory collectives straight on the transport, without the front end's hand-off to the "
       "group's worker thread. \"x MPI\", \"x Gloo\": tdist shm's speed over each (their time / tdist's)." % reps, ""]
targets = []
for n in sorted({k[1] for k in med}):
    out += ["### World size %d" % n, "",
            "| size | tdist shm µs | backend alone µs | Open MPI µs | Gloo µs | tdist shm GB/s | backend alone GB/s "
            "| Open MPI GB/s | Gloo GB/s | x MPI | x Gloo |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    sizes = sorted({k[2] for k in med if k[1] == n and k[0] == "tdist-shm"})
    for s in sizes:
        t = [med.get((i, n, s)) for i in impls]
        cells = [human(s)] + ["%.1f" % x if x else "-" for x in t]
        cells += ["%.2f" % busbw(x, s, n) if x else "-" for x in t]
        cells += ["%.2f" % (t[k] / t[0]) if t[k] and t[0] else "-" for k in (2, 3)]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    big = [s for s in sizes if s >= 1 << 20]
    def worst(impl, other, sz):
        r = [(med[(other, n, s)] / med[(impl, n, s)], s) for s in sz if (impl, n, s) in med and (other, n, s) in med]
        return min(r) if r else (None, None)
    def verdict(r, s, need):
        return ("worst %.2fx (at %s) | %s" % (r, human(s), "met" if r >= need else "missed")) if r else "no data | -"
    for impl, label in (("tdist-shm", "tdist shm"), ("tdist-shm-backend", "backend alone")):
        if n == 2:
            t8, m8 = med.get((impl, 2, 8)), med.get(("openmpi", 2, 8))
            if t8 and m8:
                targets.append("| 2 | %s | 8 B latency no worse than Open MPI | %.1f µs vs %.1f µs | %s |"
                               % (label, t8, m8, "met" if t8 <= m8 else "missed"))
            targets.append("| 2 | %s | bus bandwidth >= Open MPI from 1 MiB | %s |"
                           % (label, verdict(*worst(impl, "openmpi", big), 1)))
        else:
            targets.append("| %d | %s | faster than Open MPI at every size | %s |"
                           % (n, label, verdict(*worst(impl, "openmpi", sizes), 1)))
        targets.append("| %d | %s | >= 5x Gloo's bus bandwidth from 1 MiB | %s |"
                       % (n, label, verdict(*worst(impl, "gloo", big), 5)))
out += ["### Targets", "", "| world | what | target | result | |", "| ---: | --- | --- | --- | --- |"] + targets + [""]
out += ["### Memory bandwidth of the machine", "",
        "64 MiB operands, best of 10; GB/s of operand bytes per second (traffic: memcpy reads and writes each byte, "
        "read-add-write reads two and writes one).", "",
        "| loop | threads | GB/s (operand) | GB/s (traffic) |", "| --- | ---: | ---: | ---: |"]
for (loop, th), (op, tr) in sorted(mem.items()):
    out.append("| %s | %d | %.1f | %.1f |" % (loop, th, op, tr))
copy = mem[("memcpy", cpus)][0]
out += ["", "An all_reduce must at least read every rank's input and write every rank's output: n copies of the "
        "message. With every core copying (%.1f GB/s of bytes copied), that bounds the 64 MiB all_reduce at "
        "algbw <= %.1f / n GB/s." % (copy, copy)]
for n in sorted({k[1] for k in med}):
    t = med.get(("tdist-shm", n, 64 << 20))
    if t:
        alg = (64 << 20) / (t * 1e-6) / 1e9
        out.append("- world %d: the bound is %.2f GB/s algbw (%.2f bus); tdist shm reaches %.2f (%.0f%%)."
                   % (n, copy / n, copy / n * 2 * (n - 1) / n, alg, 100 * alg / (copy / n)))
open(os.path.join(results, "shm_peers.md"), "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
