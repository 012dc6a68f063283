#!/usr/bin/env bash
# Set up, then train on 8 MPI ranks:
#  1. the default job (configs/tiny-ppo.toml, embedded in the binary): supervised warm-ups, then
#     100 PPO steps on the planner's plan; JSON lines in runs/tiny-ppo/metrics.jsonl;
#  2. the adaptive job (configs/tiny-ppo-adaptive.toml) under the live controller: responses grow
#     toward 64 tokens on 4.5 MB ranks, the job reshapes itself as they do; the decisions print
#     under the step lines, the timeline is runs/tiny-ppo-adaptive/timeline.svg (and .png).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A fresh run refuses a directory that holds another run; the quickstart starts over.
rm -rf runs/tiny-ppo runs/tiny-ppo-adaptive
bash scripts/mpirun.sh 8 train
bash scripts/mpirun.sh 8 train configs/tiny-ppo-adaptive.toml
cat <<'MSG'

Look at:
  runs/tiny-ppo-adaptive/timeline.svg   step seconds (measured and predicted), response length,
                                        transitions marked (urgent red, opportunistic green)
  the "decision:" and "transition:" lines above: trigger, ΔL, L_tran, H, γ, verdict; measured
                                        seconds and bytes beside the prediction
  runs/tiny-ppo-adaptive/metrics.jsonl  one JSON object per step ("decision", "transition",
                                        digests before and after every transition)
MSG
