#!/usr/bin/env bash
# The live comparison of docs/evaluation.md: the adaptive tiny PPO job (8 MPI ranks) under the
# four policies, each on SEEDS job seeds (default 1 2 3), then whole-run tokens/s per policy as
# mean ± sd, Nereus's per-op-class predicted/measured ratios after calibration, and every
# transition's predicted beside its measured seconds (scripts/live-comparison.py).
#
#   cargo build --release && bash scripts/live-comparison.sh [OUT]      # ~15 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/live-comparison}
seeds=${SEEDS:-1 2 3}
mkdir -p "$out"
for seed in $seeds; do
  for policy in nereus static greedy every-k; do
    dir="$out/$policy-$seed"
    rm -rf "$dir"
    echo "== $policy, seed $seed"
    # A policy that stops the job (static: out of memory ahead, exit 2) is recorded as such.
    bash scripts/mpirun.sh 8 train configs/tiny-ppo-adaptive.toml --policy "$policy" --seed "$seed" \
      --output-dir "$dir" > "$dir.log" 2>&1 || echo "exit $?" >> "$dir.log"
  done
done
python3 scripts/live-comparison.py "$out"
