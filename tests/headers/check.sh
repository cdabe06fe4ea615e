#!/usr/bin/env bash
# Compiles each include/tdist/*.h alone, as C99 and as C++17 with -pedantic-errors -Wall -Werror,
# and a C++ use of the macros that build values (TD_SHAPE, TD_OP_*). Prints each failure.
#   bash tests/headers/check.sh <include-dir>
set -uo pipefail
inc=${1:?include dir}
cc=${CC:-cc}
cxx=${CXX:-c++}
command -v "$cxx" >/dev/null || cxx=g++
rc=0
for h in "$inc"/tdist/*.h; do
  if ! "$cc" -std=c99 -pedantic-errors -Wall -Werror -I"$inc" -fsyntax-only -x c "$h"; then
    echo "FAIL: $h as C99"; rc=1
  fi
  if ! "$cxx" -std=c++17 -pedantic-errors -Wall -Werror -I"$inc" -fsyntax-only -x c++ "$h"; then
    echo "FAIL: $h as C++17"; rc=1
  fi
done
src=$(mktemp --suffix=.cpp)
trap 'rm -f "$src"' EXIT
cat > "$src" <<'CPP'
#include <tdist/tdist.h>
int main()
{
    td_op sum = TD_OP_SUM;
    td_op premul = TD_OP_PREMUL_SUM(0.5);
    td_device cpu = {TD_DEVICE_CPU, -1};
    return (int)sum.kind + (int)premul.kind + (int)cpu.type;
}
CPP
if ! "$cxx" -std=c++17 -pedantic-errors -Wall -Werror -I"$inc" -fsyntax-only "$src"; then
  echo "FAIL: the value macros from C++17"; rc=1
fi
[ $rc -eq 0 ] && echo "all public headers compile alone as C99 and C++17 (-pedantic-errors)"
exit $rc
