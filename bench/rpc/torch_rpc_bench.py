"""torch_rpc_bench: the measurements of rpc_bench.c on PyTorch's TorchRPC (TensorPipe backend).

    python3 torch_rpc_bench.py [--tcp] [--seconds S] [--sizes B,B,...]

Two worker processes (worker0 measures, worker1 serves) meet through tcp://127.0.0.1. Without
--tcp TensorPipe picks its defaults on one host (its shm transport and cma/shm channels where they
work); --tcp restricts it to the uv (TCP) transport and the basic channel, as tdist's tcp_only.
Prints the lines rpc_bench prints ("<metric> <path> [<bytes>] <value>"), for bench/rpc/run.sh."""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

IN_FLIGHT = 64


def noop():
    return None


def echo(t):
    return t


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sync_median_us(fn, args, secs, min_calls):
    for _ in range(20):
        rpc.rpc_sync("worker1", fn, args=args)
    samples = []
    end = time.monotonic() + secs
    while len(samples) < min_calls or time.monotonic() < end:
        t0 = time.perf_counter()
        rpc.rpc_sync("worker1", fn, args=args)
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def async_rate(secs):
    ring = [rpc.rpc_async("worker1", noop) for _ in range(IN_FLIGHT)]
    done = 0
    t0 = time.monotonic()
    end = t0 + secs
    i = 0
    while True:
        ring[i].wait()
        done += 1
        if time.monotonic() >= end:
            ring[i] = None
            break
        ring[i] = rpc.rpc_async("worker1", noop)
        i = (i + 1) % IN_FLIGHT
    rate = done / (time.monotonic() - t0)
    for f in ring:
        if f is not None:
            f.wait()
    return rate


def worker(rank, port, tcp, secs, sizes):
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, init_method="tcp://127.0.0.1:%d" % port,
                                           rpc_timeout=0)
    if tcp:
        opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, init_method="tcp://127.0.0.1:%d" % port,
                                               rpc_timeout=0, _transports=["uv"], _channels=["basic"])
    rpc.init_rpc("worker%d" % rank, rank=rank, world_size=2, rpc_backend_options=opts)
    path = "tcp" if tcp else "samehost"
    if rank == 0:
        print("empty_us %s %.2f" % (path, sync_median_us(noop, (), secs, 100)), flush=True)
        print("async_calls_per_s %s %.0f" % (path, async_rate(secs)), flush=True)
        for b in sizes:
            t = torch.zeros(b // 4, dtype=torch.float32)
            print("tensor_us %s %d %.2f" % (path, b, sync_median_us(echo, (t,), secs, 10)), flush=True)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tcp", action="store_true")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--sizes", default="1024,65536,1048576,16777216,67108864")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(worker, args=(free_port(), a.tcp, a.seconds, sizes), nprocs=2, start_method="fork")


if __name__ == "__main__":
    sys.exit(main())
