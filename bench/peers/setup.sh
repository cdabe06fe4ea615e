# bench/peers/setup.sh, sourced by the scripts that put tdist beside its peers (bench/peers/run.sh,
# bench/shm/sweep.sh): installs the peers from Debian's packages when they are missing
# (python3-torch for Gloo, Open MPI, gnuplot), builds bench/peers/mpi_allreduce.c into
# $build/bench/peers/ and sets
#   py          the Python that has torch (Debian's)
#   mpibin      the MPI_Allreduce program
#   mpirun_cmd  how it is launched (an array: append -np N and the program)
# Expects $build (the tdist build folder) and the repository root as the current directory.
py=/usr/bin/python3
need=()
$py -c 'import torch.distributed' 2>/dev/null || need+=(python3-torch)
command -v mpicc >/dev/null && command -v mpirun >/dev/null || need+=(libopenmpi-dev openmpi-bin)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if [ ${#need[@]} -gt 0 ]; then
  echo "bench/peers: installing ${need[*]}" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${need[@]}" >/dev/null
fi

mkdir -p "$build/bench/peers"
mpibin=$build/bench/peers/mpi_allreduce
mpicc -O2 -o "$mpibin" bench/peers/mpi_allreduce.c -lm

# Open MPI as root on one host: shared memory between the ranks (vader), no binding (tdist's and
# Gloo's ranks are not pinned either), and yielding while it polls: Open MPI only yields on its own
# when it sees more ranks than cores, and on a machine shared with other jobs its pure busy-polling
# with 2 ranks on 2 cores waits out whole scheduler time slices (milliseconds per call). If CMA
# single-copy is not permitted here, copy through the shared segment instead.
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1)
if ! "${mpirun_cmd[@]}" -np 2 "$mpibin" --min 1M --max 1M --iters 2 --csv >/dev/null 2>&1; then
  mpirun_cmd+=(--mca btl_vader_single_copy_mechanism none)
fi
