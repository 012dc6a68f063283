#!/usr/bin/env bash
# The simulator's evaluation (docs/evaluation.md): every shipped trace under the four policies,
# each on five simulated machines (the default ground truth, not the cost model: `nereus
# simulate --truth machine`), and γ swept on the paper's 26-step trace and on the R1-Zero curve.
# Writes $OUT/<cluster>-<trace>[-<gpus>].{json,svg,png} (default OUT: docs/evaluation), then the
# tables of docs/evaluation.md (scripts/evaluation-tables.py).
#
#   cargo build --release && bash scripts/evaluation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/evaluation}
mkdir -p "$out"
bin=${NEREUS:-target/release/nereus}
job=configs/llama3.1-8b-ppo.toml

# run CLUSTER TRACE [GPUS] [extra simulate flags...]: one comparison, named after its inputs.
run() {
  local cluster=$1 trace=$2 gpus=${3:-} name
  shift 3 || shift $#
  name="$cluster-$trace${gpus:+-$gpus}"
  echo "== $name"
  "$bin" simulate "$job" --cluster "configs/clusters/$cluster.toml" --trace "configs/traces/$trace.csv" \
    ${gpus:+--gpus "$gpus"} --json "$out/$name.json" --plot "$out/$name" "$@"
}

# Pools from the traces: the paper's 26 steps (γ swept), spot and elastic 16-GPU allocations.
run a100 paper-26 "" --gamma-sweep 0,0.1,0.2,0.35,0.5,0.65,0.8,1
run a100 spot-16
run a100 elastic-16
# Published length curves on a fixed pool, at sizes where the best plan moves with the length.
run a100 paper-growth-1000 16
run a100 paper-growth-1000 256
run a100 deepscaler-1750 16
run a100 deepscaler-1750 32
run a100 r1-zero-10000 64 --gamma-sweep 0,0.1,0.2,0.35,0.5,0.65,0.8,1
# The synthetic 1,024-GPU traces on the three clusters.
for cluster in a100 h200 lumi-g; do
  for trace in growth-1000 spot-1000 both-1000; do
    run "$cluster" "$trace" 1024
  done
done
# Lengths and GPUs changing together (issue 52; `nereus trace synth --shape mixed --steps 400
# --from 1000 --to 6000 --seed N`, --gpus 64 and 1024): noisy, bursty growth while the pool moves.
for seed in 1 2 3; do
  run a100 "mixed-64-$seed"
  run lumi-g "mixed-1024-$seed"
done
python3 scripts/evaluation-tables.py "$out"
