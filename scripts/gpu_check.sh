#!/usr/bin/env bash
# The checks that need a GPU, in one go, for a machine with NVIDIA GPUs, the CUDA toolkit (nvcc)
# and CMake: build tdist with its kernels, run the CTest label gpu (the device tests' cuda
# instances), then bench/device/run.sh (tdist against torch.cuda when PyTorch is there).
#   bash scripts/gpu_check.sh [build-dir] [out-dir]
# Writes out-dir/{env.txt,build.log,ctest.log,bench.md}; exits non-zero if the build or a test failed.
set -uo pipefail
build=${1:-build/gpu}
out=${2:-$build/gpu-check}
mkdir -p "$out"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
  echo "nvcc: ${nvcc:-none}"; [ -n "$nvcc" ] && "$nvcc" --version | tail -2
  cmake --version | head -1; gcc --version | head -1; nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
rc=0
# Only what the checks run: the device tests and the device benchmark.
targets=$(ls tests/device/test_*.c | xargs -n1 basename | sed 's/\.c$//')
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTDIST_WITH_CUDA=ON -DTDIST_WITH_MPI=OFF \
         ${nvcc:+-DCUDAToolkit_ROOT=$(dirname "$(dirname "$nvcc")")} &&
       cmake --build "$build" -j "$(nproc)" --target $targets device_bench; } > "$out/build.log" 2>&1; then
  echo "build failed:"; tail -40 "$out/build.log"; exit 1
fi
echo "=== ctest -L gpu"
ctest --test-dir "$build" -L gpu -j 1 --output-on-failure --timeout 60 > "$out/ctest.log" 2>&1 || rc=1
grep -E "Test +#|tests passed|tests failed|Failed|Not Run" "$out/ctest.log" | tail -80
echo "=== bench/device"
bash bench/device/run.sh "$build" > "$out/bench.md" 2>&1 || rc=1
cat "$out/bench.md"
exit $rc
