#!/usr/bin/env bash
# Set up, then train on 8 MPI ranks:
#  1. the text job (configs/tiny-math-grpo.toml): GRPO on arithmetic word problems through the
#     shipped tokenizer and chat template, scored by the math reward; held-out accuracy printed
#     before the first step and every 20 steps, decoded responses in runs/tiny-math-grpo/samples.jsonl;
#  2. the default job (configs/tiny-ppo.toml, embedded in the binary): PPO over token ids on the
#     built-in arithmetic task, supervised warm-ups then 100 steps on the planner's plan; JSON
#     lines in runs/tiny-ppo/metrics.jsonl;
#  3. the adaptive job (configs/tiny-ppo-adaptive.toml) under the live controller: responses grow
#     toward 64 tokens on 4.5 MB ranks, the job reshapes itself as they do; the decisions print
#     under the step lines, the timeline is runs/tiny-ppo-adaptive/timeline.svg (and .png).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A fresh run refuses a directory that holds another run; the quickstart starts over.
rm -rf runs/tiny-ppo runs/tiny-ppo-adaptive runs/tiny-math-grpo
bash scripts/mpirun.sh 8 train configs/tiny-math-grpo.toml
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
  the "eval after step N" lines         the text job's held-out accuracy, rising as RL teaches it
                                        to work the sums out (docs/data.md)
  runs/tiny-math-grpo/samples.jsonl     decoded prompts, responses and rewards, step by step
MSG
