#!/usr/bin/env bash
# Installs what Nereus needs and builds the release binary (target/release/nereus).
#
#   bash scripts/setup.sh                      # MPI, hwloc, clang (for rsmpi's bindgen)
#   NEREUS_WITH_SLURM=1 bash scripts/setup.sh  # + Slurm and munge, for the local test cluster
#   NEREUS_WITH_HIP=1 bash scripts/setup.sh    # + HIP headers and runtime, to compile `--features rocm`
#
# Debian/Ubuntu packages are installed with apt-get when running as root; otherwise the missing
# ones are listed (on a cluster, load the site's MPI and hwloc modules instead).
set -euo pipefail
cd "$(dirname "$0")/.."

packages="openmpi-bin libopenmpi-dev libclang-dev libhwloc-dev pkg-config"
[ "${NEREUS_WITH_SLURM:-0}" = 1 ] && packages="$packages slurm-wlm munge"
[ "${NEREUS_WITH_HIP:-0}" = 1 ] && packages="$packages libamdhip64-dev"

missing=""
if command -v dpkg >/dev/null; then
  for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "setup: missing packages:$missing (install them, or load your site's MPI/hwloc modules)" >&2
    exit 1
  fi
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
cargo build --release --locked
