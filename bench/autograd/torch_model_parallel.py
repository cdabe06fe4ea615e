"""torch_model_parallel: examples/model_parallel.c's training step on PyTorch: the MLP 16-H-H-4 split
across two workers (stage1: layer 1; stage2: layers 2-3), a trainer running each step in a
dist_autograd context (forward over rpc_sync, cross-entropy, dist_autograd.backward,
DistributedOptimizer(SGD, momentum 0.9).step), TorchRPC with TensorPipe on one host, one thread per
process. Prints "step_ms <median>" over STEPS steps after a warm-up.

    python3 torch_model_parallel.py [--steps N] [--hidden H] [--batch B]"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer

DIM, CLASSES = 16, 4


def make_param(init):
    return init.clone().requires_grad_(True)


def stage1(w1, b1, x):
    return torch.relu(torch.addmm(b1.local_value(), x, w1.local_value()))


def stage2(w2, b2, w3, b3, h1):
    h2 = torch.relu(torch.addmm(b2.local_value(), h1, w2.local_value()))
    return torch.addmm(b3.local_value(), h2, w3.local_value())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(steps, hidden, batch):
    g = torch.Generator().manual_seed(1234)
    shapes = [(DIM, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, CLASSES), (CLASSES,)]
    params = [rpc.remote("stage1" if i < 2 else "stage2", make_param, args=(torch.randn(*s, generator=g) * 0.1,))
              for i, s in enumerate(shapes)]
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05, momentum=0.9)
    x = torch.randn(batch, DIM, generator=g)
    y = torch.randint(0, CLASSES, (batch,), generator=g)
    times = []
    for i in range(steps + 20):
        t0 = time.perf_counter()
        with dist_autograd.context() as ctx:
            h1 = rpc.rpc_sync("stage1", stage1, args=(params[0], params[1], x))
            logits = rpc.rpc_sync("stage2", stage2, args=(params[2], params[3], params[4], params[5], h1))
            loss = F.cross_entropy(logits, y)
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e3)
    print("step_ms %.3f" % statistics.median(times), flush=True)


def worker(rank, port, steps, hidden, batch):
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, init_method="tcp://127.0.0.1:%d" % port)
    rpc.init_rpc(["trainer", "stage1", "stage2"][rank], rank=rank, world_size=3, rpc_backend_options=opts)
    if rank == 0:
        train(steps, hidden, batch)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(worker, args=(free_port(), a.steps, a.hidden, a.batch), nprocs=3, start_method="fork")


if __name__ == "__main__":
    sys.exit(main())
