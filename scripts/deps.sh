#!/usr/bin/env bash
# Installs the Debian packages that building and testing tdist need, when they are missing:
# the toolchain, clang and its runtime (fuzzing), pkg-config (the install test), libcrypto's headers
# (connection authentication) and Open MPI (the mpi backend and its tests under mpirun). As root it runs apt-get; otherwise it prints the command
# to run. Benchmark peers (python3-torch, gnuplot) are installed by the bench scripts, never here.
set -euo pipefail

packages=(cmake make gcc g++ pkg-config clang libclang-rt-14-dev libopenmpi-dev openmpi-bin libssl-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "tdist needs these packages; run as root:" >&2
  echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
