#!/usr/bin/env bash
# mpirun for this machine: `bash scripts/mpirun.sh N nereus-args...` runs N ranks of
# target/release/nereus, allowing more ranks than cores and (in containers) running as root.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/mpirun.sh N nereus-args...}
shift
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
exec mpirun --oversubscribe -n "$n" target/release/nereus "$@"
