"""torch_rref_bench: the measurements of rref_bench.c on PyTorch's TorchRPC (TensorPipe backend).

    python3 torch_rref_bench.py [--tcp] [--seconds S]

Three worker processes (worker0 measures, worker1 owns, worker2 receives the shared RRef) meet
through tcp://127.0.0.1; --tcp restricts TensorPipe to its uv transport and basic channel. Prints
the lines rref_bench prints ("<metric> <path> <value>"), for bench/rpc/rref_run.sh."""
import argparse
import os
import socket
import statistics
import sys
import time

import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def one():
    return 1


def fetch(rref):
    return rref.to_here()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_to_here(_):
    rref = rpc.remote("worker1", one)
    assert rref.to_here() == 1
    del rref


def three_workers(held):
    assert rpc.rpc_sync("worker2", fetch, args=(held,)) == 1


def median_us(op, arg, secs):
    for _ in range(50):
        op(arg)
    samples = []
    end = time.monotonic() + secs
    while len(samples) < 100 or time.monotonic() < end:
        t0 = time.perf_counter()
        op(arg)
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def worker(rank, port, tcp, secs):
    kw = dict(num_worker_threads=16, init_method="tcp://127.0.0.1:%d" % port, rpc_timeout=0)
    if tcp:
        kw.update(_transports=["uv"], _channels=["basic"])
    rpc.init_rpc("worker%d" % rank, rank=rank, world_size=3, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(**kw))
    path = "tcp" if tcp else "samehost"
    if rank == 0:
        print("remote_to_here_us %s %.2f" % (path, median_us(remote_to_here, None, secs)), flush=True)
        held = rpc.remote("worker1", one)
        print("three_workers_us %s %.2f" % (path, median_us(three_workers, held, secs)), flush=True)
        del held
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tcp", action="store_true")
    p.add_argument("--seconds", type=float, default=1.0)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(worker, args=(free_port(), a.tcp, a.seconds), nprocs=3, start_method="fork")


if __name__ == "__main__":
    sys.exit(main())
