#!/usr/bin/env bash
# Usage: run.sh BUILD_DIR CONSUMER_SRC. Installs BUILD_DIR into a temporary prefix, then builds and
# runs the consumer with find_package(tdist) (shared and static targets) and with pkg-config.
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/tdist/tdist.h"
test -f "$tmp/prefix/lib/cmake/tdist/tdistConfig.cmake"
test -f "$tmp/prefix/lib/pkgconfig/tdist.pc"

cmake -S "$src" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer_shared" | grep -qx "consumer: 1+2+3+4 = 10 (tdist $(sed -n 's/^Version: //p' "$tmp/prefix/lib/pkgconfig/tdist.pc"))"
"$tmp/consumer/consumer_static" | grep -q "consumer: 1+2+3+4 = 10"

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -o "$tmp/pc_consumer" "$src/consumer.c" $(pkg-config --cflags --libs tdist)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_consumer" | grep -q "consumer: 1+2+3+4 = 10"
echo "install: find_package (shared, static) and pkg-config consumers built and ran"
