"""What the benchmark summaries of bench/peers/run.sh, bench/shm/summarize.py and
bench/shm/sweep_summary.py share: nccl-tests' bus bandwidth and the sizes as the tables print them."""


def busbw(us, size, n):
    """Bus bandwidth in GB/s of an all_reduce of size bytes over n ranks taking us microseconds
    (nccl-tests: size / time x 2(n-1)/n)."""
    return size / (us * 1e-6) / 1e9 * 2 * (n - 1) / n


def human(b):
    """A size in bytes as the tables print it: 8 B, 4 KiB, 16 MiB, 1 GiB."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return "%g %s" % (b / f, unit)
    return "%d B" % b
