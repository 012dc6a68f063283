#!/usr/bin/env bash
# Set up, then run the default job (configs/tiny-ppo.toml, embedded in the binary) on 8 MPI
# ranks: supervised warm-ups, then 100 PPO steps; one line per step on stdout, JSON lines in
# runs/tiny-ppo/metrics.jsonl, checkpoints in runs/tiny-ppo/checkpoints/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A fresh run refuses a directory that holds another run; the quickstart starts over.
rm -rf runs/tiny-ppo
bash scripts/mpirun.sh 8 train
