#!/usr/bin/env bash
# The test suite: rustfmt and clippy, unit tests, integration tests that launch target/release/nereus under
# `mpirun -n 4` (and under `sbatch`/`srun --mpi=pmix` on a local one-node Slurm cluster when one
# can be started), all built once with the `cuda`, `rocm` and `exact` features, then the device
# kernels' compiles.
#
#   bash scripts/test.sh
#
# Under CI=true every part is required; elsewhere the Slurm and ROCm parts are skipped, with a
# note, when this machine cannot run them. The kernel compiles (scripts/compile-kernels.sh: NVRTC
# and ptxas from PyPI, hipcc) are required under CI, where the unit tests run them with the tools
# required, and skipped elsewhere when the tools are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=${CI:-false}

# The suite builds in target/ (a few GiB) beside the Python reference and the
# kernel tools; say up front when the disk is short, since running out shows up later as a
# linker's bus error or a pip traceback.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
echo "test: $((free_kib / 1048576)) GiB free on the filesystem of $PWD"
if [ "$free_kib" -lt $((8 * 1048576)) ]; then
  echo "test: warning: under 8 GiB free; the suite may run out of disk (cargo clean, or free space)" >&2
fi

if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null; then
  bash slurm/local-cluster.sh start
  export NEREUS_SLURM_TESTS=1
elif [ "$ci" = true ]; then
  echo "test: CI needs root and slurm-wlm for the sbatch test" >&2
  exit 1
else
  echo "test: no local Slurm cluster (needs root and slurm-wlm); the sbatch test will be skipped"
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

echo "== the test-only Python reference (transformers' tokenizers and chat templates, numpy's RL formulas)"
if python=$(bash scripts/py-test-env.sh); then
  export NEREUS_TEST_PYTHON=$python
elif [ "$ci" = true ]; then
  echo "test: CI needs the reference Python environment (scripts/py-test-env.sh)" >&2
  exit 1
else
  echo "test: no reference Python environment; the parity tests against it are skipped"
fi

# One feature set for everything: the backends (`cuda`, `rocm`: cudarc and HIP load the driver and
# the collectives at run time, so no toolkit is needed to build) and `exact` (the MILPs beside the
# planner and the transition scheduler, solved by HiGHS, which highs-sys builds from source with
# cmake). The binary the integration tests launch is the one `scripts/setup.sh` built with
# NEREUS_FEATURES set to the same list (CI does), so nothing is compiled twice.
features=cuda
if command -v cmake >/dev/null; then
  features=cuda,exact
elif [ "$ci" = true ]; then
  echo "test: CI needs cmake to build HiGHS for the exact feature" >&2
  exit 1
else
  echo "test: no cmake; skipping the exact feature (NEREUS_WITH_EXACT=1 bash scripts/setup.sh installs it)"
fi
if [ -f /usr/include/hip/hip_runtime_api.h ] || [ -n "${HIP_PATH:-}" ]; then
  export HIP_PATH=${HIP_PATH:-/usr}
  features=$features,rocm
elif [ "$ci" = true ]; then
  echo "test: CI needs the HIP headers (libamdhip64-dev) to compile the rocm feature" >&2
  exit 1
else
  echo "test: no HIP headers; skipping the rocm build (NEREUS_WITH_HIP=1 bash scripts/setup.sh installs them)"
fi
if [ "$ci" = true ]; then
  export NEREUS_REQUIRE_KERNEL_TOOLS=1  # build.rs then fails without hipcc, as it does on a bad kernel
fi
# NVRTC and ptxas from PyPI, for the unit test that compiles crates/kernels/device/*.cu (skipped when absent
# outside CI).
source scripts/kernel-env.sh

echo "== rustfmt and clippy, with features $features and with the default features (the house style is enforced, not suggested)"
cargo fmt --check
cargo clippy --release --locked --workspace --all-targets --features "$features" -- -D warnings
# The default build (what `cargo build --release` gives a user) has its own cfg branches.
cargo clippy --release --locked --workspace --all-targets -- -D warnings

echo "== unit tests, MPI and Slurm integration tests (features $features)"
cargo test --release --locked --workspace --features "$features"

# The criterion benches are type-checked by clippy's --all-targets above.

echo "== device kernels compile without a GPU (crates/kernels/device/*.cu: NVRTC + ptxas for sm_80/sm_90, hipcc for gfx90a, no register spills)"
if [ "${NEREUS_REQUIRE_KERNEL_TOOLS:-0}" = 1 ]; then
  # Under CI the workspace's unit tests above ran scripts/compile-kernels.sh's six tests with
  # the tools required (none could skip), on the same build and environment: not run twice.
  echo "test: done by the unit tests above, with NEREUS_REQUIRE_KERNEL_TOOLS=1 (NVRTC $(ls "${nereus_nvrtc:-/nonexistent}"/lib/libnvrtc.so.* 2>/dev/null | head -1), ptxas ${NEREUS_PTXAS:-missing}, $(command -v hipcc || echo 'hipcc missing'))"
elif python3 -c 'import nvidia.cuda_nvrtc' 2>/dev/null && command -v hipcc >/dev/null; then
  bash scripts/compile-kernels.sh --workspace --features "$features"
else
  echo "test: NVRTC or hipcc missing; skipping (NEREUS_WITH_KERNEL_TOOLS=1 bash scripts/setup.sh installs them)"
fi
