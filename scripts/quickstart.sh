#!/usr/bin/env bash
# Set up, then run the default job (configs/tiny-ppo.toml, embedded in the binary) on 4 MPI
# ranks. Until `nereus run` exists, "run" means: every rank loads the job, all ranks agree on
# its hash, rank 0 prints it resolved; then every rank reports its node, binding and device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/mpirun.sh 4 inspect config
bash scripts/mpirun.sh 4 inspect topology
