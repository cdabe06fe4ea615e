#!/usr/bin/env bash
# `make fuzz`: build the libFuzzer targets in fuzz/ with clang (ASan+UBSan) and run each for the
# given number of seconds, starting from its seed corpus in fuzz/corpus/<target>/. A crash, leak
# or sanitizer report fails the run and leaves the reproducer in the build folder.
set -euo pipefail
build=$(realpath -m "${1:-build/fuzz}")
seconds=${2:-30}
src=$(pwd)
cc=$(command -v clang || command -v clang-14 || true)
[ -n "$cc" ] || { echo "fuzz: clang not found (scripts/deps.sh installs it)" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug -DTDIST_FUZZ=ON \
  -DTDIST_SANITIZE=address,undefined -DTDIST_WERROR=ON -DBUILD_TESTING=OFF \
  -DTDIST_BUILD_TOOLS=OFF -DTDIST_BUILD_EXAMPLES=OFF -DTDIST_BUILD_BENCH=OFF \
  -DTDIST_WITH_MPI=OFF -DTDIST_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"
rc=0
failed=()
for bin in "$build"/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  corpus="$build/corpus/$name"
  mkdir -p "$corpus"
  seeds=()
  [ -d "$src/fuzz/corpus/$name" ] && seeds=("$src/fuzz/corpus/$name")
  echo "=== $name: ${seconds}s"
  # Run inside the build folder, where libFuzzer leaves any crash reproducer.
  if ! (cd "$build" && "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "$corpus" "${seeds[@]}" > "$build/$name.log" 2>&1); then
    tail -n 40 "$build/$name.log"
    echo "=== $name FAILED (log: $build/$name.log)"
    failed+=("$name")
    rc=1
  else
    grep -E "stat::number_of_executed_units|Done" "$build/$name.log" | tail -n 2
  fi
done
# Repeat what failed at the end, where a log's tail (all CI keeps) shows it: the sanitizer's or
# libFuzzer's verdict, where it happened, and the input that did it (base64, to replay with
# `base64 -d > crash; fuzz_NAME crash`).
for name in "${failed[@]}"; do
  echo "=== $name FAILED:"
  grep -E "^==[0-9]+==|SUMMARY|^    #[0-9] |Test unit written|fuzz_[a-z_]+: " "$build/$name.log" | head -n 20 || true
  for f in $(grep -oE "\./(crash|leak|timeout|oom|slow-unit)-[0-9a-f]+" "$build/$name.log" | sort -u); do
    echo "input $f ($(stat -c %s "$build/$f") bytes), base64:"
    head -c 4096 "$build/$f" | base64 -w 100
  done
done
exit $rc
