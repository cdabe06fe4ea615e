#!/usr/bin/env bash
# `make bench`: runs every benchmark suite (bench/*/run.sh) against the given build folder. Each
# suite installs its own peers (python3-torch, Open MPI) and prints the table it adds to
# docs/performance.md. bench/soak (make soak) is left out.
set -euo pipefail
build=${1:-build/plain}
rc=0
for s in bench/*/run.sh; do
  [ -f "$s" ] || continue
  # the soak run is no benchmark and takes hours: `make soak` runs it
  [ "$s" = bench/soak/run.sh ] && continue
  echo "=== $s"
  bash "$s" "$build" || rc=1
done
exit $rc
