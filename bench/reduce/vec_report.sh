#!/usr/bin/env bash
# Which loops of src/tensor/reduce.c gcc vectorizes, per function: compiles the file as the build
# does (-O3) with -fopt-info-vec, after splitting the macro-generated functions onto their own
# lines so that each report names its function. Extra gcc flags may follow (e.g. -march=native).
# Usage: bench/reduce/vec_report.sh BUILD_DIR [gcc flags...]
set -euo pipefail
build=${1:?usage: vec_report.sh BUILD_DIR [gcc flags]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${CC:-gcc} -std=gnu11 -D_GNU_SOURCE -I"$root/include" -I"$root/src" -I"$build/src" -E -P "$root/src/tensor/reduce.c" |
    sed 's/\(static \(inline \)\?\(void\|td_status\|float\|double\|uint8_t\|int8_t\|int16_t\|int32_t\|int64_t\|uint16_t\|td_c64\|td_c128\) [a-z_0-9]*(\)/\n\1/g' \
    >"$tmp/reduce.c"
${CC:-gcc} -std=gnu11 -O3 -fPIC "$@" -c "$tmp/reduce.c" -o "$tmp/reduce.o" -fopt-info-vec-optimized 2>"$tmp/info" || true
# Line -> function name, then one row per kernel: for the baseline and the AVX2 build, which of
# its loops (oop: dst = a op b; left: dst == a; right: dst == b; self: dst == a == b; scale and
# divide: PREMUL_SUM and AVG) gcc vectorized and with what vector sizes. The AVX2 float16 and
# bfloat16 kernels are written with intrinsics; gcc reports only their scalar tails.
python3 - "$tmp/reduce.c" "$tmp/info" <<'PY'
import re, sys
names = {}
for i, line in enumerate(open(sys.argv[1]), 1):
    m = re.match(r"static (?:inline )?\w+ (\w+)\(", line)
    if m:
        names[i] = m.group(1)
rows = {}
for line in open(sys.argv[2]):
    m = re.search(r":(\d+):\d+: optimized: loop vectorized using (\d+) byte vectors", line)
    if not m:
        continue
    n = int(m.group(1))
    while n > 0 and n not in names:
        n -= 1
    fn = names.get(n, "?")
    m2 = re.match(r"(oop|left|right|self|scale16|scale|divide|kernel)_(\w+?)(_avx2)?$", fn)
    if not m2:
        continue
    loop, kernel, avx2 = m2.groups()
    if loop in ("kernel", "scale16"):
        loop = "intrinsics (scalar tail)"
    key = "AVX2" if avx2 else "baseline"
    rows.setdefault(kernel, {}).setdefault(key, {}).setdefault(loop, set()).add(int(m.group(2)))
print(f"{'kernel':12s} {'baseline loops vectorized':44s} AVX2 loops vectorized")
for kernel, isas in rows.items():
    cols = []
    for key in ("baseline", "AVX2"):
        loops = isas.get(key, {})
        widths = sorted({w for ws in loops.values() for w in ws}, reverse=True)
        cols.append(" ".join(sorted(loops)) + (f" ({'/'.join(map(str, widths))} B)" if loops else "-"))
    print(f"{kernel:12s} {cols[0]:44s} {cols[1]}")
PY
