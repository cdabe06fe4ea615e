#!/usr/bin/env bash
# Compiles each include/tdist/*.h alone as C99, C11, C++11 and C++17 with -Wall -Wextra
# -pedantic-errors -Werror, and a C++ use of the macros that build values (TD_OP_*). Prints each
# failure.
#   bash tests/headers/check.sh <include-dir>
set -uo pipefail
inc=${1:?include dir}
cc=${CC:-cc}
cxx=${CXX:-c++}
command -v "$cxx" >/dev/null || cxx=g++
rc=0
flags="-pedantic-errors -Wall -Wextra -Werror -I$inc -fsyntax-only"
for h in "$inc"/tdist/*.h; do
  for std in c99 c11; do
    "$cc" -std=$std $flags -x c "$h" || { echo "FAIL: $h as $std"; rc=1; }
  done
  for std in c++11 c++17; do
    "$cxx" -std=$std $flags -x c++ "$h" || { echo "FAIL: $h as $std"; rc=1; }
  done
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
if ! "$cxx" -std=c++11 $flags "$src"; then
  echo "FAIL: the value macros from C++17"; rc=1
fi
[ $rc -eq 0 ] && echo "all public headers compile alone as C99, C11, C++11 and C++17 (-Wall -Wextra -pedantic-errors)"
exit $rc
