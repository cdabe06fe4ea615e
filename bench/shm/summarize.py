#!/usr/bin/env python3
# The table of docs/performance.md, "Collectives on one host", from the files bench/shm/run.sh
# leaves in its results folder (allreduce_peers.csv, backend.csv, membw.csv). Prints it and writes
# it into shm_peers.md there.
#
#   python3 bench/shm/summarize.py RESULTS_DIR REPEATS
import csv, os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from tables import busbw, human
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

impls = ["tdist-shm", "tdist-shm-backend", "openmpi", "gloo"]
out = ["float32 all_reduce (SUM, in place), one host. Time per call in µs (median over %s runs of each "
       "program's median over batches of the slowest rank's mean); bus bandwidth in GB/s (nccl-tests: size / "
       "time x 2(n-1)/n). \"tdist shm\" is td_pg_all_reduce on the shm backend (tdist-bench); \"backend alone\" "
       "calls the shared-memory collectives straight on the transport, without the process-group front end "
       "(checks, work record, future). \"x MPI\", \"x Gloo\": tdist shm's speed over each (their time / tdist's)." % reps, ""]
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
copy = max(op for (loop, th), (op, tr) in mem.items() if loop == "memcpy")
out += ["", "An all_reduce must at least read every rank's input and write every rank's output: n copies of the "
        "message. At the best copy rate measured (%.1f GB/s of bytes copied, with however many threads), that "
        "bounds the 64 MiB all_reduce at algbw <= %.1f / n GB/s." % (copy, copy)]
for n in sorted({k[1] for k in med}):
    t = med.get(("tdist-shm", n, 64 << 20))
    if t:
        alg = (64 << 20) / (t * 1e-6) / 1e9
        out.append("- world %d: the bound is %.2f GB/s algbw (%.2f bus); tdist shm reaches %.2f (%.0f%%)."
                   % (n, copy / n, copy / n * 2 * (n - 1) / n, alg, 100 * alg / (copy / n)))
open(os.path.join(results, "shm_peers.md"), "w").write("\n".join(out) + "\n")
print("\n".join(out))
