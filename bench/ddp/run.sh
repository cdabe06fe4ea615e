#!/usr/bin/env bash
# bench/ddp/run.sh: one DDP training step (forward, backward with the bucket all_reduces, SGD with
# momentum) of the demo's MLP (16-96-96-4, one bucket per layer as examples/ddp_train has them) and
# of a wider one (16-1024-1024-1024-4, DDP's default buckets), float32, batch 32 per rank, at each
# world size, on one host: tdist (ddp_bench under tdrun, default backend) against PyTorch's
# DistributedDataParallel with Gloo (torch_ddp_bench.py, python3-torch, one thread per process),
# alternating, REPEATS times. Prints a table of the medians over the runs: step time (median ms of a
# run), steps per second, the share of communication hidden behind the backward (each side's own
# DDP statistics) and tdist's speed-up in steps per second. Builds nothing.
#
#   bash bench/ddp/run.sh [BUILD_DIR (build/plain)] [REPEATS (3)] [MODELS ("mlp wide")] [WORLDS ("2 4")]
#
# STEPS (500) and WIDE_STEPS (30) set the timed steps per run; BIND=core pins each rank of both
# programs to one CPU (tdrun --bind-to core, the same in torch_ddp_bench.py; default none);
# TORCH_LIB_DIR, when set, is put first on PyTorch's LD_LIBRARY_PATH (a folder with another
# libblas.so.3, say OpenBLAS's, for a check of how much of the wide model's ratio is the BLAS that
# Debian's PyTorch calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/plain}
reps=${2:-3}
models=${3:-mlp wide}
worlds=${4:-2 4}
steps=${STEPS:-500}
wide_steps=${WIDE_STEPS:-30}
bind=${BIND:-none}
bin=$build/bench/ddp/ddp_bench
tdrun=$build/tools/tdrun/tdrun
for b in "$bin" "$tdrun"; do
  [ -x "$b" ] || { echo "bench/ddp: $b is missing (make build)" >&2; exit 1; }
done
py=/usr/bin/python3
$py -c 'import torch.distributed' 2>/dev/null || { echo "bench/ddp: needs python3-torch (apt-get install python3-torch)" >&2; exit 1; }
ptenv=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
[ -n "${TORCH_LIB_DIR:-}" ] && ptenv+=(LD_LIBRARY_PATH="$TORCH_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$reps"); do
  for model in $models; do
    if [ "$model" = wide ]; then n=$wide_steps; warm=5; kb=0; else n=$steps; warm=50; kb=1; fi
    for w in $worlds; do
      args=(--model "$model" --steps "$n" --warmup "$warm" --bucket-kb "$kb")
      line=$("$tdrun" --standalone --quiet --bind-to "$bind" --nproc-per-node "$w" "$bin" "${args[@]}" | sed -n 's/.*\(step_ms .*\)/\1/p')
      [ -n "$line" ] && echo "$model $w $line" >> "$out/tdist" || echo "bench/ddp: ddp_bench $model at $w failed (run $r)" >&2
      line=$("${ptenv[@]}" $py bench/ddp/torch_ddp_bench.py --world "$w" --bind-to "$bind" "${args[@]}" 2>"$out/torch.err" | sed -n 's/^\(step_ms .*\)/\1/p')
      [ -n "$line" ] && echo "$model $w $line" >> "$out/torch" ||
        { echo "bench/ddp: torch_ddp_bench.py $model at $w failed (run $r):" >&2; tail -5 "$out/torch.err" >&2; }
    done
  done
done
echo "# raw lines: MODEL WORLD step_ms M steps_per_s S backward_ms B comm_ms C hidden_pct H buckets K"
sed 's/^/tdist /' "$out/tdist"
sed 's/^/torch /' "$out/torch"
$py - "$out/tdist" "$out/torch" "$reps" "$($py -c 'import torch; print(torch.__version__)')" "$bind" <<'PY'
import statistics, sys

def load(path):
    runs = {}
    for line in open(path):
        f = line.split()
        kv = dict(zip(f[2::2], f[3::2]))
        runs.setdefault((f[0], int(f[1])), []).append({k: float(v) for k, v in kv.items() if k != "buckets"} |
                                                       {"buckets": kv.get("buckets", "?")})
    return runs

td, pt = load(sys.argv[1]), load(sys.argv[2])
med = lambda rows, k: statistics.median(r[k] for r in rows)
names = {"mlp": "MLP 16-96-96-4 (demo, 3 buckets)", "wide": "MLP 16-1024-1024-1024-4 (2 buckets)"}
print("\nDDP training step, float32, batch 32 per rank, one host, ranks bound to CPUs: %s; medians of %s runs "
      "(PyTorch %s, Gloo)" % (sys.argv[5], sys.argv[3], sys.argv[4]))
print("| model | world | tdist step (ms) | tdist steps/s | tdist hidden | PyTorch step (ms) | PyTorch steps/s "
      "| PyTorch hidden | tdist speed-up |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for key in sorted(td, key=lambda k: (k[0] != "mlp", k[1])):
    a, b = td[key], pt.get(key)
    if not b:
        continue
    rate = lambda v: "%.0f" % v if v >= 100 else "%.1f" % v
    print("| %s | %d | %.3f | %s | %.0f%% | %.3f | %s | %.0f%% | %.2fx |" % (
        names.get(key[0], key[0]), key[1], med(a, "step_ms"), rate(med(a, "steps_per_s")), med(a, "hidden_pct"),
        med(b, "step_ms"), rate(med(b, "steps_per_s")), med(b, "hidden_pct"),
        med(a, "steps_per_s") / med(b, "steps_per_s")))
PY
