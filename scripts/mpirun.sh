#!/usr/bin/env bash
# mpirun for this machine: `bash scripts/mpirun.sh N nereus-args...` runs N ranks of
# target/release/nereus, allowing more ranks than cores and (in containers) running as root.
#
# A SIGTERM or SIGINT to this script reaches the ranks as SIGUSR2 (SIGUSR1 and SIGUSR2 as they
# are), which mpirun forwards without killing them (on SIGTERM it would kill them a second
# later): `nereus train` checkpoints at the next step boundary and everything exits 75.
# mpirun forwards a signal only to ranks it has started, so one that arrives during MPI
# bring-up would be lost: the script holds it until mpirun's ranks have run for a second (their
# handlers are installed first thing), then forwards it once.
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
pending=""
# A second TERM or INT while the first is still held (a bring-up that hangs) ends mpirun.
on_term() {
  if [ -n "$pending" ]; then
    kill -TERM "$pid" 2>/dev/null || true
  fi
  pending=USR2
}
trap on_term TERM INT
trap '[ "$pending" = USR2 ] || pending=USR1' USR1
trap 'pending=USR2' USR2
# Whether mpirun has started its ranks (Open MPI 4 forks them itself), from /proc: no procps.
ranks_up() {
  grep -qs "^PPid:[[:space:]]*$pid\$" /proc/[0-9]*/status
}
up=0
status=0
while kill -0 "$pid" 2>/dev/null; do
  if ranks_up; then
    up=$((up + 1))
    if [ -n "$pending" ] && [ "$up" -ge 5 ]; then
      kill -"$pending" "$pid" 2>/dev/null || true
      pending=""
    fi
  elif [ "$up" -gt 0 ]; then
    pending="" # the ranks have exited: mpirun is tearing down, and a signal now would kill it
  fi
  # A trap interrupts the wait, so a signal to running ranks goes out at once.
  sleep 0.2 &
  wait $! 2>/dev/null || true
done
wait "$pid" || status=$?
exit "$status"
