#!/usr/bin/env bash
# The asynchronous-training table of docs/engine.md ("Asynchronous training"): the shipped text
# job (configs/tiny-math-grpo.toml, 8 MPI ranks, 60 steps, held-out accuracy every 10 steps)
# synchronous, and with rl.mode = "async" at max_staleness k = 1 and k = 2, each on SEEDS job
# seeds (default 1 2 3); then the table (scripts/async-comparison.py): step seconds, tokens/s,
# seconds to accuracy 0.80 / 0.85, accuracy at steps 10 and 60, weight syncs, mean staleness.
# STEPS (default 60) and MODES (default "sync async-1 async-2") shorten it for a smoke test.
#
#   cargo build --release && bash scripts/async-comparison.sh [OUT]      # ~20 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/async-comparison}
seeds=${SEEDS:-1 2 3}
steps=${STEPS:-60}
modes=${MODES:-sync async-1 async-2}
# scripts/mpirun.sh always runs target/release/nereus; NEREUS_BIN lets a copied binary run while
# target/ is rebuilt, so mpirun is called here the way mpirun.sh calls it.
bin=${NEREUS_BIN:-target/release/nereus}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
mkdir -p "$out"
for seed in $seeds; do
  for mode in $modes; do
    dir="$out/$mode-$seed"
    rm -rf "$dir"
    args=()
    # async-K: rl.mode = "async" with rl.max_staleness = K.
    [ "$mode" != sync ] && args=(--set rl.mode=async --set "rl.max_staleness=${mode#async-}")
    echo "== $mode, seed $seed"
    # A failed run is recorded in its log and the table is made from the runs that finished.
    mpirun --oversubscribe -n 8 "$bin" train configs/tiny-math-grpo.toml --seed "$seed" \
      --steps "$steps" --set data.eval_every=10 "${args[@]}" --output-dir "$dir" \
      > "$dir.log" 2>&1 || echo "exit $?" | tee -a "$dir.log"
  done
done
python3 scripts/async-comparison.py "$out"
