#!/usr/bin/env bash
# bench/ab: two builds of tdist against each other in one run, for a change that must keep the
# figures (a restructuring). The shared host's speed drifts by more than such a change between runs
# an hour apart (2x at some sizes), so comparing with figures recorded earlier says little; here the
# two builds alternate (A B, then B A), REPEATS times, for each case: td_pg_all_reduce on the tcp,
# shm or auto backend (tdist-bench) and the shm backend alone (shm_coll_bench), world sizes 2 and
# 4, float32 SUM from MIN to MAX. Prints, per case and size, each build's median time per call over
# the repeats and B / A - 1 (negative: B is faster). Each program measures as tools/tdist-bench does
# (median over batches of the slowest rank's mean per call).
#
#   bash bench/ab/run.sh BUILD_A BUILD_B [REPEATS (3)] [SECONDS per size (0.3)]
# Environment: WORLDS ("2 4"), MIN (8), MAX (64M), FACTOR (8), CASES ("tcp shm alone"; also auto),
# OUT (a CSV of every measurement; default: a temporary file, removed).
set -euo pipefail
a=${1:?BUILD_A}
b=${2:?BUILD_B}
reps=${3:-3}
secs=${4:-0.3}
worlds=${WORLDS:-2 4}
cases=${CASES:-tcp shm alone}
common=(--min "${MIN:-8}" --max "${MAX:-64M}" --factor "${FACTOR:-8}" --time "$secs")
bins=tools/tdist-bench/tdist-bench
[[ " $cases " == *" alone "* ]] && bins="$bins bench/shm/shm_coll_bench"
for build in "$a" "$b"; do
  for bin in $bins; do
    [ -x "$build/$bin" ] || { echo "bench/ab: $build/$bin is missing (build the tdist-bench and shm_coll_bench targets)" >&2; exit 2; }
  done
done
csv=${OUT:-$(mktemp)}
[ -n "${OUT:-}" ] || trap 'rm -f "$csv"' EXIT
echo "side,case,world,size,time_us,rep" > "$csv"

run_one() { # side build case world rep
  local side=$1 build=$2 case=$3 w=$4 rep=$5 out
  case $case in
    alone) out=$("$build/bench/shm/shm_coll_bench" -n "$w" "${common[@]}") ;;
    # --nranks: the spelling of the number of ranks that builds from before and after -n became
    # nccl-tests' iteration count both take.
    *) out=$("$build/tools/tdist-bench/tdist-bench" --nranks "$w" --backend "$case" --op all_reduce --dtype f32 \
               "${common[@]}" --csv --no-header) ;;
  esac
  # CSV columns as tools/tdist-bench prints them: ...,size (7),count,time_us (9),... (the same in
  # builds with and without the in-place columns, which come after them)
  grep -v '^impl' <<< "$out" | awk -F, -v s="$side" -v c="$case" -v w="$w" -v r="$rep" \
    '{print s "," c "," w "," $7 "," $9 "," r}' >> "$csv"
  echo "bench/ab: $side ($build), $case, world $w, run $rep" >&2
}

for rep in $(seq "$reps"); do
  for case in $cases; do
    for w in $worlds; do
      if [ $((rep % 2)) = 1 ]; then order="A B"; else order="B A"; fi
      for side in $order; do
        if [ "$side" = A ]; then build=$a; else build=$b; fi
        run_one "$side" "$build" "$case" "$w" "$rep"
      done
    done
  done
done

python3 - "$csv" "$a" "$b" "$reps" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
path, a, b, reps = sys.argv[1:5]
t = defaultdict(list)
for r in csv.DictReader(open(path)):
    t[(r["case"], int(r["world"]), int(r["size"]), r["side"])].append(float(r["time_us"]))
names = {"tcp": "td_pg_all_reduce, tcp backend", "shm": "td_pg_all_reduce, shm backend",
         "auto": "td_pg_all_reduce, auto backend", "alone": "shm backend alone (shm_coll_bench)"}
def fmt_size(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"
print(f"A = {a}, B = {b}; float32 SUM all_reduce, median of {reps} runs, time per call in µs.")
for case in names:
    for w in sorted({k[1] for k in t if k[0] == case}):
        print(f"\n{names[case]}, world size {w}:\n")
        print("| size | A µs | B µs | B / A - 1 |\n| ---: | ---: | ---: | ---: |")
        for size in sorted({k[2] for k in t if k[0] == case and k[1] == w}):
            ta, tb = (statistics.median(t[(case, w, size, s)]) for s in "AB")
            print(f"| {fmt_size(size)} | {ta:.2f} | {tb:.2f} | {tb / ta - 1:+.1%} |")
EOF
