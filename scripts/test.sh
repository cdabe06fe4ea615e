#!/usr/bin/env bash
# `make test`: configure and build the plain and the ASan+UBSan configurations with warnings as
# errors, run CTest in both, and print one summary. Exits non-zero if anything failed.
set -uo pipefail
build=${1:-build}
jobs=$(nproc)
declare -A result
for cfg in plain asan; do
  echo "=== build: $cfg"
  if ! make --no-print-directory BUILD="$build" "$([ $cfg = plain ] && echo build || echo asan)"; then
    result[$cfg]="BUILD FAILED"
    continue
  fi
  echo "=== ctest: $cfg"
  log="$build/$cfg/ctest-summary.txt"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir "$build/$cfg" -j "$jobs" --output-on-failure --timeout 900 2>&1 | tee "$log"
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then result[$cfg]=passed; else result[$cfg]=FAILED; fi
done
echo
echo "=== summary"
rc=0
for cfg in plain asan; do
  line=$(grep -E 'tests passed|tests failed' "$build/$cfg/ctest-summary.txt" 2>/dev/null | tail -1)
  echo "$cfg: ${result[$cfg]}${line:+ ($line)}"
  [ "${result[$cfg]}" = passed ] || rc=1
done
exit $rc
