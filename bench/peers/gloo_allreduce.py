#!/usr/bin/env python3
"""Gloo's all_reduce through torch.distributed (Debian's python3-torch), measured the way tdist-bench
measures (tools/tdist-bench/measure.c), with the same sizes, options and output columns, so that
bench/peers/run.sh can put the two side by side.

    python3 gloo_allreduce.py --nproc 4 --min 8 --max 64M --csv

float32 SUM in place on CPU tensors, blocking dist.all_reduce calls. For each size: the check (every
rank fills 1 + (3 * rank + i) % 4, and the wrong elements of the sum are counted and summed over
the ranks), then one timed call whose slowest-rank time sets the warm-up (about 50 ms worth,
1 to 1000 calls), the warm-up timed to estimate a call, then --time seconds of calls (at least
--min-iters; -n/--iters sets the number, as in tdist-bench and nccl-tests) in --batches batches as
even as can be, each after a barrier; the time is the median over batches of the slowest rank's
mean per call. The parent hosts a TCPStore on a free port; the ranks are started with
torch.multiprocessing.spawn and meet through it. --nproc (--nranks) is the number of ranks.
"""
import argparse
import datetime
import math
import os
import sys
import time


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B") if s.upper().endswith(("KB", "MB", "GB")) else s.strip().upper()
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", "--nranks", dest="nranks", type=int, default=2)
    p.add_argument("-b", "--min", type=parse_size, default=8)
    p.add_argument("-e", "--max", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--factor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=0)
    p.add_argument("-w", "--warmup", type=int, default=-1)
    p.add_argument("--time", type=float, default=0.3)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("--csv", action="store_true")
    p.add_argument("--no-header", action="store_true")
    p.add_argument("--impl", default="gloo")
    p.add_argument("--timeout", type=float, default=300.0)
    return p.parse_args(argv)


def sizes(o):
    req = o.min
    while True:
        yield req
        if req >= o.max:
            return
        nxt = int(math.floor(req * o.factor + 0.5))
        req = req + 1 if nxt <= req else nxt
        if req > o.max:
            return


def worker(rank, world, port, o):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=o.timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=o.timeout))

    def agree(values, op):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def run(t, n):
        for _ in range(n):
            dist.all_reduce(t)

    buf = torch.zeros(max(o.max // 4, 1), dtype=torch.float32)
    factor = 2.0 * (world - 1) / world
    if rank == 0 and not o.no_header:
        if o.csv:
            print("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters")
        else:
            print("# gloo (torch %s) all_reduce, %d ranks, dtype float32, reduce op SUM" % (torch.__version__, world))
            print("# time: median of %d batches of the slowest rank's mean time per call (barrier before each batch)"
                  % o.batches)
            print("# algbw = size / time; busbw = algbw x 2(n-1)/n (nccl-tests); GB/s = 1e9 bytes/s\n#")
            print("# %10s %12s %9s %7s %5s %11s %12s %12s %8s %9s" % ("size", "count", "type", "redop", "root",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters"))
        sys.stdout.flush()
    last = None
    total_wrong = 0
    for req in sizes(o):
        count = max(1, req // 4)
        nbytes = count * 4
        if nbytes == last:
            continue
        last = nbytes
        t = buf[:count]
        wrong = -1
        if o.check:
            idx = torch.arange(count, dtype=torch.int64)
            t.copy_(((3 * rank + idx) % 4 + 1).to(torch.float32))
            dist.all_reduce(t)
            want = torch.zeros(count, dtype=torch.float32)
            for r in range(world):
                want += ((3 * r + idx) % 4 + 1).to(torch.float32)
            wrong = int(agree([float((t != want).sum().item())], dist.ReduceOp.SUM)[0])
            total_wrong += wrong
        t0 = time.perf_counter()
        run(t, 1)
        t1 = agree([time.perf_counter() - t0], dist.ReduceOp.MAX)[0]
        warmup = o.warmup if o.warmup >= 0 else min(1000, max(1, math.ceil(0.05 / max(t1, 1e-9))))
        est = t1
        if warmup > 0:
            t0 = time.perf_counter()
            run(t, warmup)
            est = agree([(time.perf_counter() - t0) / warmup], dist.ReduceOp.MAX)[0]
        iters = o.iters if o.iters > 0 else min(10000000, max(o.min_iters, math.ceil(o.time / max(est, 1e-9))))
        batches = min(iters, o.batches)
        times = []
        for b in range(batches):
            k = iters // batches + (b < iters % batches)  # the first batches take the rest
            dist.barrier()
            t0 = time.perf_counter()
            run(t, k)
            times.append((time.perf_counter() - t0) / k)
        times = sorted(agree(times, dist.ReduceOp.MAX))
        med = times[batches // 2] if batches % 2 else 0.5 * (times[batches // 2 - 1] + times[batches // 2])
        if rank == 0:
            us = med * 1e6
            algbw = nbytes / med / 1e9
            busbw = algbw * factor
            w = "N/A" if wrong < 0 else str(wrong)
            if o.csv:
                print("%s,all_reduce,%d,float32,SUM,-1,%d,%d,%.3f,%.6f,%.6f,%s,%d"
                      % (o.impl, world, nbytes, count, us, algbw, busbw, w, iters))
            else:
                print("  %10d %12d %9s %7s %5d %11.2f %12.3f %12.3f %8s %9d"
                      % (nbytes, count, "float32", "SUM", -1, us, algbw, busbw, w, iters))
            sys.stdout.flush()
    if rank == 0 and not o.csv and not o.no_header:
        print("# wrong elements: %d (%s)" % (total_wrong, "FAILED" if total_wrong else "OK"))
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(3)


def main():
    o = parse_args()
    import torch.distributed as dist
    import torch.multiprocessing as mp

    master = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=o.timeout),
                           wait_for_workers=False)
    sys.stdout.flush()
    try:
        mp.spawn(worker, args=(o.nranks, master.port, o), nprocs=o.nranks, join=True)
    except mp.ProcessExitedException as e:
        print("gloo_allreduce: %s" % e, file=sys.stderr)
        return 3 if e.exit_code == 3 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
