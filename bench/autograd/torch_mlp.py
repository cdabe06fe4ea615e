"""PyTorch's CPU autograd on the examples' MLP (16-96-96-4, ReLU, cross-entropy, batch 32, float32,
one thread): the median microseconds of forward + backward and of backward alone, printed as rows
of autograd_bench's table (bench/autograd/run.sh)."""
import sys
import time

import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
hand_us = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
torch.set_num_threads(1)
torch.manual_seed(0)
DIM, H, C, B = 16, 96, 4, 32
params = [torch.randn(DIM, H) * 0.35, torch.zeros(H), torch.randn(H, H) * 0.14, torch.zeros(H),
          torch.randn(H, C) * 0.1, torch.zeros(C)]
for p in params:
    p.requires_grad_(True)
w1, b1, w2, b2, w3, b3 = params
x = torch.randn(B, DIM)
y = torch.randint(0, C, (B,))


def loss_fn():
    a1 = torch.relu(torch.addmm(b1, x, w1))
    a2 = torch.relu(torch.addmm(b2, a1, w2))
    return torch.nn.functional.cross_entropy(torch.addmm(b3, a2, w3), y)


step, bwd = [], []
for r in range(-200, reps):
    t0 = time.perf_counter()
    for p in params:
        p.grad = None
    loss = loss_fn()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    if r >= 0:
        step.append((t2 - t0) * 1e6)
        bwd.append((t2 - t1) * 1e6)
step.sort()
bwd.sort()
s, b = step[len(step) // 2], bwd[len(bwd) // 2]
ratio = (lambda v: "%10.2f" % (v / hand_us)) if hand_us > 0 else (lambda v: "%10s" % "-")
print("%-34s %12.1f %s" % ("pytorch %s autograd fwd+bwd" % torch.__version__.split("+")[0], s, ratio(s)))
print("%-34s %12.1f %s" % ("pytorch autograd bwd only", b, ratio(b)))
