# Sourced by the batch scripts: runs `nereus train` so that a stop signal requeues the job and a
# lost rank restarts it on the ranks that remain.
#
# Stop signals. `nereus train` checkpoints at the next step boundary and exits with status 75 on
# SIGTERM (Slurm's preemption, `scancel`: both give KillWait seconds before SIGKILL), SIGUSR1 and
# SIGUSR2 (`#SBATCH --signal=USR1@120`: two minutes' warning before the time limit), caught from
# the start of the process. On 75 the job requeues itself (it was submitted with `--requeue`),
# and the requeued job resumes from the newest complete checkpoint (`--resume auto`: a fresh
# start when there is none yet, as after a crash before the first checkpoint).
#
# Lost ranks. Debian's OpenMPI 4.1 has no ULFM: a rank whose process dies takes the job step
# down (SLURM_KILL_BAD_EXIT=1 ends the other tasks at once rather than at the watchdog). Any
# status other than 0, 2 (a usage error: restarting would fail the same way) and 75 counts as
# one rank lost: the step is started again with one task fewer (SLURM_NTASKS, which srun reads
# for -n) and `--resume auto`; the planner replans for the smaller world from the newest
# complete checkpoint (or starts afresh when the crash came before the first). At most NEREUS_MAX_RESTARTS (default 3) restarts, never below one task.
# With `#SBATCH --no-kill` the allocation survives a failed node.
#
#   train_requeueable srun [srun flags] "$NEREUS" train CONFIG [flags]

EXIT_USAGE=2
EXIT_PREEMPTED=75
export SLURM_KILL_BAD_EXIT=1

train_requeueable() {
  local rc=0 restarts=0 tasks=${SLURM_NTASKS:-1}
  "$@" --resume auto || rc=$?
  while [ "$rc" -ne 0 ] && [ "$rc" -ne "$EXIT_USAGE" ] && [ "$rc" -ne "$EXIT_PREEMPTED" ] \
        && [ "$restarts" -lt "${NEREUS_MAX_RESTARTS:-3}" ] && [ "$tasks" -gt 1 ]; do
    restarts=$((restarts + 1))
    tasks=$((tasks - 1))
    echo "nereus: the job step failed (status $rc): restart $restarts on $tasks ranks from the latest checkpoint" >&2
    rc=0
    SLURM_NTASKS=$tasks SLURM_NPROCS=$tasks "$@" --resume auto || rc=$?
  done
  if [ "$rc" -eq "$EXIT_PREEMPTED" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "nereus: stopped by a signal after a checkpoint; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$rc"
}
