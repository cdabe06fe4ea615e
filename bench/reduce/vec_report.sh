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
# Line -> function name, then one row per function with the vector widths gcc used.
python3 - "$tmp/reduce.c" "$tmp/info" <<'PY'
import re, sys
names = {}
for i, line in enumerate(open(sys.argv[1]), 1):
    m = re.match(r"static (?:inline )?\w+ (\w+)\(", line)
    if m:
        names[i] = m.group(1)
found = {}
for line in open(sys.argv[2]):
    m = re.search(r":(\d+):\d+: optimized: loop vectorized using (\d+) byte vectors", line)
    if not m:
        continue
    n = int(m.group(1))
    while n > 0 and n not in names:
        n -= 1
    found.setdefault(names.get(n, "?"), set()).add(int(m.group(2)))
for fn, widths in found.items():
    print(f"{fn:24s} {', '.join(str(w) for w in sorted(widths, reverse=True))}-byte vectors")
PY
