#!/usr/bin/env bash
# `make test`: configure and build the plain, the ASan+UBSan and the ThreadSanitizer
# configurations with warnings as errors, run CTest in each, and print one summary. Exits non-zero
# if anything failed. Usage: test.sh [BUILD_DIR [CONFIG...]] (configs: plain asan tsan; default all).
set -uo pipefail
build=${1:-build}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(plain asan tsan)
jobs=$(nproc)
here=$(cd "$(dirname "$0")/.." && pwd)
declare -A result
for cfg in "${configs[@]}"; do
  case $cfg in
    plain) target=build ;;
    asan | tsan) target=$cfg ;;
    *) echo "test.sh: unknown configuration '$cfg' (plain, asan or tsan)" >&2; exit 2 ;;
  esac
  echo "=== build: $cfg"
  if ! make --no-print-directory BUILD="$build" "$target"; then
    result[$cfg]="BUILD FAILED"
    continue
  fi
  # A case spends much of its time waiting on its ranks or on a timeout it tests (two cores were
  # 60-70% busy at -j 2 under TSan): one more case at a time keeps them busy (TSan 695 -> 630 s).
  cfg_jobs=$((jobs + 1))
  echo "=== ctest: $cfg (-j $cfg_jobs)"
  log="$build/$cfg/ctest-summary.txt"
  start=$(date +%s)
  # Open MPI is not built with ThreadSanitizer: tests/mpi/tsan.supp hides its internals' races.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$here/tests/mpi/tsan.supp} \
    ctest --test-dir "$build/$cfg" -j "$cfg_jobs" --output-on-failure --timeout 900 2>&1 | tee "$log"
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then result[$cfg]=passed; else result[$cfg]=FAILED; fi
  echo "ctest seconds: $(($(date +%s) - start))" >>"$log"
done
echo
echo "=== summary"
rc=0
for cfg in "${configs[@]}"; do
  line=$(grep -E 'tests passed|tests failed' "$build/$cfg/ctest-summary.txt" 2>/dev/null | tail -1)
  secs=$(grep -E '^ctest seconds' "$build/$cfg/ctest-summary.txt" 2>/dev/null | tail -1)
  echo "$cfg: ${result[$cfg]}${line:+ ($line)}${secs:+, $secs}"
  [ "${result[$cfg]}" = passed ] || rc=1
done
exit $rc
