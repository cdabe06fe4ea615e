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

# A C++-only project without MPI finds the package and links the shared library.
cmake -S "$src/../consumer_cxx" -B "$tmp/consumer_cxx" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer_cxx" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer_cxx/consumer_cxx" | grep -qx "consumer_cxx: 1+2+3+4 = 10 (op SUM)"

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -o "$tmp/pc_consumer" "$src/consumer.c" $(pkg-config --cflags --libs tdist)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_consumer" | grep -q "consumer: 1+2+3+4 = 10"
# pkg-config --static links the static library alone, with its private dependencies.
# shellcheck disable=SC2046
cc -o "$tmp/pc_consumer_static" "$src/consumer.c" -I"$tmp/prefix/include" "$tmp/prefix/lib/libtdist.a" \
  $(pkg-config --static --libs-only-other --libs-only-l tdist | sed 's/-ltdist//')
"$tmp/pc_consumer_static" | grep -q "consumer: 1+2+3+4 = 10"
echo "install: find_package (shared, static, C++ without MPI) and pkg-config (shared, static) consumers built and ran"
