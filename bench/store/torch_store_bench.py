#!/usr/bin/python3
"""PyTorch's TCPStore round trips per second, the peer of store_bench.c (same operations, same
output: "<op> <clients> <ops per second>").

The master (its server thread) runs in this process. One client is a second TCPStore handle in
this process; N > 1 clients are N processes (threads would share the GIL), each with its own
handle, started together on a barrier."""
import argparse
import datetime
import multiprocessing as mp
import sys
import time

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=120)


def client(port, index, op, seconds, value_bytes, barrier, results):
    store = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT, wait_for_workers=False)
    key = "k%d" % index
    value = b"v" * value_bytes
    store.set(key, value)
    store.get(key)  # set does not wait for an answer in this version: make sure it landed
    keys = [key]
    if barrier is not None:
        barrier.wait()
    n = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            if op == "set":
                store.set(key, value)
            elif op == "get":
                store.get(key)
            elif op == "add":
                store.add("counter", 1)
            else:
                store.wait(keys)
        n += 64
    if op == "set":
        store.get(key)  # the sets before it were all served
    elapsed = time.perf_counter() - start
    if results is None:
        return n / elapsed
    results.put(n / elapsed)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--ops", default="set,get,add,wait")
    p.add_argument("--value-bytes", type=int, default=16)
    a = p.parse_args()
    master = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    for op in a.ops.split(","):
        if a.clients == 1:
            rate = client(master.port, 0, op, a.seconds, a.value_bytes, None, None)
        else:
            barrier = ctx.Barrier(a.clients)
            results = ctx.Queue()
            procs = [ctx.Process(target=client, args=(master.port, i, op, a.seconds, a.value_bytes, barrier, results))
                     for i in range(a.clients)]
            for pr in procs:
                pr.start()
            rate = sum(results.get() for _ in procs)
            for pr in procs:
                pr.join()
        print("%s %d %.0f" % (op, a.clients, rate), flush=True)


if __name__ == "__main__":
    sys.exit(main())
