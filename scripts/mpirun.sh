#!/usr/bin/env bash
# mpirun for this machine: `bash scripts/mpirun.sh N nereus-args...` runs N ranks of
# target/release/nereus, allowing more ranks than cores and (in containers) running as root.
#
# A SIGTERM or SIGINT to this script reaches the ranks as SIGUSR2 (SIGUSR1 and SIGUSR2 as they
# are), which mpirun forwards without killing them (on SIGTERM it would kill them a second
# later): `nereus train` checkpoints at the next step boundary and everything exits 75.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/mpirun.sh N nereus-args...}
shift
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
mpirun --oversubscribe -n "$n" target/release/nereus "$@" &
pid=$!
trap 'kill -USR2 "$pid" 2>/dev/null || true' TERM INT
trap 'kill -USR1 "$pid" 2>/dev/null || true' USR1
trap 'kill -USR2 "$pid" 2>/dev/null || true' USR2
status=0
# `wait` returns early when a trapped signal arrives: wait again until mpirun has exited.
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid" && status=0 || status=$?
done
exit "$status"
