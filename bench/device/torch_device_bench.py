"""The peer of device_bench: PyTorch's CUDA caching allocator, copies and torch.cuda.comm, printed as
rows of the same table. Needs torch with CUDA and a GPU (exit 77 otherwise)."""
import sys
import time

import torch

quick = "--quick" in sys.argv
if not torch.cuda.is_available():
    print("torch_device_bench: no CUDA GPU", file=sys.stderr)
    sys.exit(77)


def size_str(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1024:
        return f"{n >> 10} KiB"
    return f"{n} B"


stream = torch.cuda.current_stream()
for size in (512, 64 << 10, 4 << 20, 64 << 20):
    p = torch.cuda.caching_allocator_alloc(size, 0, stream)
    torch.cuda.caching_allocator_delete(p)
    n = 20000 if quick else 200000
    t0 = time.perf_counter()
    for _ in range(n):
        p = torch.cuda.caching_allocator_alloc(size, 0, stream)
        torch.cuda.caching_allocator_delete(p)
    dt = time.perf_counter() - t0
    print(f"| torch allocator alloc+delete (Python) | {size_str(size)} | {n / dt / 1e6:.2f} | M pairs/s |")


def time_copy(dst, src, reps):
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


for nbytes in (1 << 20, 64 << 20):
    n = nbytes // 4
    pinned = torch.empty(n, dtype=torch.float32).pin_memory()
    dev = torch.empty(n, dtype=torch.float32, device="cuda:0")
    dev2 = torch.empty(n, dtype=torch.float32, device="cuda:0")
    reps = 3 if quick else (200 if nbytes == 1 << 20 else 20)
    print(f"| torch copy host->device (pinned) | {size_str(nbytes)} | {nbytes / time_copy(dev, pinned, reps) / 1e9:.2f} | GB/s |")
    print(f"| torch copy device->host (pinned) | {size_str(nbytes)} | {nbytes / time_copy(pinned, dev, reps) / 1e9:.2f} | GB/s |")
    print(f"| torch copy device->device (same) | {size_str(nbytes)} | {nbytes / time_copy(dev2, dev, reps) / 1e9:.2f} | GB/s |")

ndev = torch.cuda.device_count()
if ndev >= 2:
    import torch.cuda.comm as comm

    devs = list(range(ndev))
    for total in (1 << 20, 64 << 20):
        ts = [torch.ones(total // 4 // 64, device="cuda:0") for _ in range(64)]
        best = 1e30
        for r in range(3 if quick else 6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            comm.broadcast_coalesced(ts, devs)
            for d in devs:
                torch.cuda.synchronize(d)
            if r:
                best = min(best, time.perf_counter() - t0)
        print(f"| torch broadcast_coalesced 64 tensors to {ndev} devices | {size_str(total)} | {total / best / 1e9:.2f} | GB/s per destination |")
        ins = [torch.ones(total // 4, device=f"cuda:{d}") for d in devs]
        best = 1e30
        for r in range(3 if quick else 6):
            t0 = time.perf_counter()
            comm.reduce_add(ins, 0)
            for d in devs:
                torch.cuda.synchronize(d)
            if r:
                best = min(best, time.perf_counter() - t0)
        print(f"| torch reduce_add of {ndev} tensors | {size_str(total)} | {total / best / 1e9:.2f} | GB/s per input |")
