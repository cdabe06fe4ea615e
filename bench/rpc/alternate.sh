# bench/rpc/alternate.sh, sourced by run.sh and rref_run.sh: what both do before making their
# table. rpc_alternate BUILD NAME SECS REPS checks that BUILD/bench/rpc/NAME exists, installs
# Debian's python3-torch when missing, then alternates NAME and torch_NAME.py (same flags, same
# output lines), each on the same-host path and over TCP, REPS times, appending their lines to
# $out/tdist and $out/torch ($out: a temporary folder removed at exit). Sets py, out and
# torch_version.
# rpc_need_torch: sets py to Debian's Python and installs python3-torch when it lacks TorchRPC
# (also for bench/rpc/large_floor.sh).
rpc_need_torch() {
  py=/usr/bin/python3
  if ! $py -c 'import torch.distributed.rpc' 2>/dev/null; then
    echo "bench/rpc: installing python3-torch (Debian) for the TorchRPC peer" >&2
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y python3-torch >/dev/null
  fi
}

rpc_alternate() {
  local build=$1 name=$2 secs=$3 reps=$4
  local bin=$build/bench/rpc/$name
  [ -x "$bin" ] || { echo "bench/rpc: $bin is missing (make build)" >&2; exit 1; }
  rpc_need_torch
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  local r mode
  for r in $(seq "$reps"); do
    for mode in "" --tcp; do
      "$bin" $mode --seconds "$secs" >> "$out/tdist" || echo "bench/rpc: $name $mode failed (run $r)" >&2
      $py "bench/rpc/torch_$name.py" $mode --seconds "$secs" 2>"$out/torch.err" >> "$out/torch" ||
        { echo "bench/rpc: torch_$name.py $mode failed (run $r):" >&2; tail -5 "$out/torch.err" >&2; }
    done
  done
  mkdir -p bench/results/rpc
  torch_version=$($py -c 'import torch; print(torch.__version__)')
}
