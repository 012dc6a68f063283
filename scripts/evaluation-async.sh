#!/usr/bin/env bash
# Synchronous against asynchronous training in the simulator (docs/evaluation.md, "Asynchronous
# training"): configs/llama3.1-8b-ppo.toml and its async variant (k = 1) at 1,024 GPUs on the
# shipped length traces, five simulated machines each. Sync runs nereus and static; async runs
# static (the layouts never change: no adapting at weight sync) and nereus (the controller
# adapts at each weight sync). Writes $OUT/<cluster>-<trace>-1024-{sync,async}.json (default OUT:
# docs/evaluation/async), then the table (scripts/evaluation-async-table.py). About 20 minutes a cluster
# on two cores (the async controller's replans search every generation/training split).
#
#   cargo build --release && bash scripts/evaluation-async.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/evaluation/async}
mkdir -p "$out"
bin=${NEREUS:-target/release/nereus}

for cluster in ${CLUSTERS:-a100 lumi-g}; do
  for trace in growth-1000 both-1000 spot-1000; do
    for mode in sync async; do
      job=configs/llama3.1-8b-ppo.toml
      [ "$mode" = async ] && job=configs/llama3.1-8b-ppo-async.toml
      name="$cluster-$trace-1024-$mode"
      echo "== $name"
      "$bin" simulate "$job" --cluster "configs/clusters/$cluster.toml" --trace "configs/traces/$trace.csv" \
        --gpus 1024 --policies nereus,static --seed 1 --seeds 5 --json "$out/$name.json"
    done
  done
done
python3 scripts/evaluation-async-table.py "$out"
