# Sourced by the batch scripts: runs `nereus train` so that a stop signal requeues the job.
#
# `nereus train` checkpoints at the next step boundary and exits with status 75 on SIGTERM
# (Slurm's preemption, `scancel`: both give KillWait seconds before SIGKILL) and on the signal
# `[job] checkpoint_on_signal` names (SIGUSR1 with `#SBATCH --signal=USR1@120`: two minutes'
# warning before the time limit). On 75 the job requeues itself (it was submitted with
# `--requeue`), and the requeued job resumes from the newest complete checkpoint
# (`--resume auto`: a fresh start when there is none yet). Any other status ends the job.
#
#   train_requeueable srun [srun flags] "$NEREUS" train CONFIG [flags]

EXIT_PREEMPTED=75

train_requeueable() {
  local rc=0
  "$@" --resume auto || rc=$?
  if [ "$rc" -eq "$EXIT_PREEMPTED" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "nereus: stopped by a signal after a checkpoint; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$rc"
}
