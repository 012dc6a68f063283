#!/usr/bin/env bash
# Stand up (or stop) a one-node Slurm cluster on this machine, for tests: munge, slurmctld and
# slurmd, with the PMIx MPI plugin so `srun --mpi=pmix` direct-launches Open MPI ranks.
#
#   bash slurm/local-cluster.sh start    # idempotent; waits until the node is idle
#   bash slurm/local-cluster.sh stop
#   bash slurm/local-cluster.sh status
#
# Runs as root (it writes /etc/slurm/slurm.conf and starts daemons). The node advertises the
# machine's real CPU count, so jobs with more tasks than cores need `--overcommit`.
set -euo pipefail

conf=/etc/slurm/slurm.conf
node=$(hostname -s)

write_conf() {
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
  cat > "$conf" <<CONF
# Written by nereus slurm/local-cluster.sh: a one-node test cluster.
ClusterName=nereus-local
SlurmctldHost=${node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=${node} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=local Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.2; done
  echo "local-cluster: munged did not come up" >&2; exit 1
}

wait_idle() {
  for _ in $(seq 100); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    case "$state" in idle*|mix*|alloc*) echo "local-cluster: node $node is $state"; return ;; esac
    sleep 0.3
  done
  echo "local-cluster: node $node did not become idle (state: ${state:-none}); see /var/log/slurm/" >&2
  exit 1
}

case "${1:-start}" in
  start)
    write_conf
    start_munge
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
    wait_idle
    ;;
  stop)
    pkill -x slurmd || true
    pkill -x slurmctld || true
    ;;
  status)
    sinfo
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
