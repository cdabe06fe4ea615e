"""torch.multiprocessing's queue, measured as bench/mp/mp_bench.c measures td_mp_queue.

A forked producer puts N tensors on a torch.multiprocessing Queue; the parent gets each, reads its
first and last element and drops it. "shared" cycles over 4 tensors already in shared memory
(share_memory_()); "fresh" puts a new tensor each time (the queue's feeder moves it into shared
memory). The producer keeps its tensors until the consumer is done. Prints markdown rows.

Usage: python3 torch_mp_bench.py [--quick] [--strategy file_descriptor|file_system]
"""
import sys
import time

import torch
import torch.multiprocessing as mp


def producer(q, go, ready, done, nbytes, n, fresh):
    ring = [] if fresh else [torch.zeros(nbytes, dtype=torch.uint8).share_memory_() for _ in range(4)]
    ready.set()
    go.wait()
    for i in range(n):
        t = torch.full((nbytes,), i & 0x7F, dtype=torch.uint8) if fresh else ring[i % 4]
        q.put(t)
        del t
    done.wait()


def run_queue(ctx, nbytes, n, fresh):
    q = ctx.Queue()
    go, ready, done = ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=producer, args=(q, go, ready, done, nbytes, n, fresh), daemon=True)
    p.start()
    ready.wait()
    t0 = time.perf_counter()
    go.set()
    sink = 0
    for _ in range(n):
        t = q.get(timeout=120)
        sink ^= int(t[0]) ^ int(t[-1])
        del t
    secs = time.perf_counter() - t0
    done.set()
    p.join(60)
    return secs


def row(size, what, nbytes, n, secs):
    per_s = n / secs
    print(f"| {size} | {what} | {n} | {per_s:.0f} | {per_s * nbytes / 1e9:.1f} | {secs / n * 1e6:.2f} |", flush=True)


def main():
    quick = "--quick" in sys.argv
    if "--strategy" in sys.argv:
        mp.set_sharing_strategy(sys.argv[sys.argv.index("--strategy") + 1])
    strategy = mp.get_sharing_strategy()
    ctx = mp.get_context("fork")
    cases = [("4 KiB", 4096, 20000, 5000), ("1 MiB", 1 << 20, 20000, 1000), ("64 MiB", 64 << 20, 5000, 40)]
    div = 10 if quick else 1
    for label, nbytes, shared_n, fresh_n in cases:
        ns, nf = shared_n // div, max(fresh_n // div, 4)
        row(label, f"torch {torch.__version__} mp.Queue ({strategy}), tensor already shared", nbytes, ns,
            run_queue(ctx, nbytes, ns, False))
        row(label, f"torch {torch.__version__} mp.Queue ({strategy}), new tensor per put", nbytes, nf,
            run_queue(ctx, nbytes, nf, True))


if __name__ == "__main__":
    main()
