"""torch_ddp_bench: bench/ddp/ddp_bench.c's training step on PyTorch's DistributedDataParallel with
the Gloo backend: the same MLP (float32 addmm layers with weights [in, out], ReLU, cross-entropy;
"mlp" 16-96-96-4, "wide" 16-1024-1024-1024-4), one fixed batch of B rows per rank, the same bucket
sizes (--bucket-kb K sets bucket_cap_mb and the first bucket, dist._DEFAULT_FIRST_BUCKET_BYTES;
0 keeps the defaults, 25 MiB and 1 MiB), SGD with momentum 0.9 and zero_grad(set_to_none=True).
WORLD processes on one host (torch.multiprocessing.spawn), one thread each. Rank 0 prints the
median step time, the steps per second over the timed loop, and DDP's own runtime statistics
(_get_ddp_logging_data: avg_backward_compute_time, avg_backward_comm_time,
avg_backward_compute_comm_overlap_time, sampled every iteration here) in ddp_bench's line format:
    step_ms M steps_per_s S backward_ms B comm_ms C hidden_pct H buckets K

    python3 torch_ddp_bench.py [--world N] [--model mlp|wide] [--steps N] [--warmup N] [--batch B]
                               [--bucket-kb K] [--bind-to none|core]
--bind-to core pins rank i to the i-th CPU the script may use (modulo their count), as tdrun's flag."""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

DIM, CLASSES = 16, 4
DIMS = {"mlp": [DIM, 96, 96, CLASSES], "wide": [DIM, 1024, 1024, 1024, CLASSES]}


class MLP(torch.nn.Module):
    """Parameters registered w0, b0, w1, b1, ...: ddp_bench's order (DDP buckets them in reverse)."""

    def __init__(self, dims):
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.layers = len(dims) - 1
        for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
            self.register_parameter("w%d" % k, torch.nn.Parameter((torch.rand(i, o, generator=g) - 0.5) * 2 *
                                                                  (2.0 / i) ** 0.5))
            self.register_parameter("b%d" % k, torch.nn.Parameter(torch.zeros(o)))

    def forward(self, x, y):
        h = x
        for k in range(self.layers):
            h = torch.addmm(getattr(self, "b%d" % k), h, getattr(self, "w%d" % k))
            if k + 1 < self.layers:
                h = torch.relu(h)
        return F.cross_entropy(h, y)


def run(rank, args, port):
    if args.bind_to == "core":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    if args.bucket_kb > 0:
        dist._DEFAULT_FIRST_BUCKET_BYTES = args.bucket_kb * 1024
    model = MLP(DIMS[args.model])
    cap_mb = args.bucket_kb / 1024.0 if args.bucket_kb > 0 else 25
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    ddp._set_ddp_runtime_logging_sample_rate(1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(args.batch, DIM, generator=g)
    y = torch.randint(0, CLASSES, (args.batch,), generator=g)
    times = []
    t_loop = 0.0
    for i in range(-args.warmup, args.steps):
        if i == 0:
            t_loop = time.perf_counter()
        t0 = time.perf_counter()
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 0:
            times.append((time.perf_counter() - t0) * 1e3)
    t_loop = time.perf_counter() - t_loop
    log = ddp._get_ddp_logging_data()
    comp = float(log.get("avg_backward_compute_time", 0))
    comm = float(log.get("avg_backward_comm_time", 0))
    overlap = float(log.get("avg_backward_compute_comm_overlap_time", 0))
    stats = torch.tensor([comp, comm, overlap], dtype=torch.float64)
    dist.all_reduce(stats)
    comp, comm, overlap = (v / args.world for v in stats.tolist())
    if rank == 0:
        print("step_ms %.3f steps_per_s %.1f backward_ms %.3f comm_ms %.3f hidden_pct %.1f buckets %s" %
              (statistics.median(times), args.steps / t_loop, comp / 1e6, comm / 1e6,
               100.0 * overlap / comm if comm > 0 else 0.0, len(str(log.get("rebuilt_bucket_sizes", log.get("bucket_sizes", ""))).split(","))), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", choices=sorted(DIMS), default="mlp")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-kb", type=int, default=0)
    ap.add_argument("--bind-to", choices=["none", "core"], default="none")
    a = ap.parse_args()
    mp.spawn(run, args=(a, free_port()), nprocs=a.world, join=True)
