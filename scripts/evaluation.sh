#!/usr/bin/env bash
# The simulator's evaluation (docs/evaluation.md): the shipped traces on the three clusters,
# four policies each, γ swept on the paper's 26-step trace. Writes docs/evaluation/<cluster>-<trace>.{json,svg,png}.
#
#   cargo build --release && bash scripts/evaluation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/evaluation
mkdir -p "$out"
bin=${NEREUS:-target/release/nereus}
job=configs/llama3.1-8b-ppo.toml
for cluster in a100 h200 lumi-g; do
  for trace in growth-1000 spot-1000 both-1000; do
    "$bin" simulate "$job" --cluster "configs/clusters/$cluster.toml" --trace "configs/traces/$trace.csv" \
      --gpus 1024 --json "$out/$cluster-$trace.json" --plot "$out/$cluster-$trace"
  done
  "$bin" simulate "$job" --cluster "configs/clusters/$cluster.toml" --trace configs/traces/paper-26.csv \
    --gamma-sweep 0,0.2,0.4,0.5,0.65,0.8,1 --json "$out/$cluster-paper-26.json" --plot "$out/$cluster-paper-26"
done
