#!/usr/bin/env bash
# Installs what Nereus needs and builds the release binary (target/release/nereus).
#
#   bash scripts/setup.sh                      # MPI, hwloc, clang (for rsmpi's bindgen), g++ (the grid emulator)
#   NEREUS_WITH_SLURM=1 bash scripts/setup.sh  # + Slurm and munge, for the local test cluster
#   NEREUS_WITH_HIP=1 bash scripts/setup.sh    # + HIP headers and runtime, to compile `--features rocm`
#   NEREUS_WITH_KERNEL_TOOLS=1 bash scripts/setup.sh  # + hipcc (apt) and NVRTC and ptxas (PyPI) to
#                                              # compile crates/kernels/device/ without a GPU (scripts/compile-kernels.sh)
#   NEREUS_WITH_EXACT=1 bash scripts/setup.sh  # + cmake, to build HiGHS for `--features exact`
#                                              # (`nereus bench solver`; the build takes ~7 min on 2 cores)
#   NEREUS_FEATURES=cuda,exact,rocm bash scripts/setup.sh  # build the binary with these cargo features
#                                              # (CI does: the test suite then builds nothing twice)
#
# Debian/Ubuntu packages are installed with apt-get when running as root; otherwise the missing
# ones are listed (on a cluster, load the site's MPI and hwloc modules instead).
set -euo pipefail
cd "$(dirname "$0")/.."

packages="openmpi-bin libopenmpi-dev libclang-dev libhwloc-dev pkg-config g++"
[ "${NEREUS_WITH_SLURM:-0}" = 1 ] && packages="$packages slurm-wlm munge"
[ "${NEREUS_WITH_HIP:-0}" = 1 ] && packages="$packages libamdhip64-dev"
[ "${NEREUS_WITH_EXACT:-0}" = 1 ] && packages="$packages cmake"
if [ "${NEREUS_WITH_KERNEL_TOOLS:-0}" = 1 ]; then
  packages="$packages libamdhip64-dev hipcc curl"
  python3 -m pip --version >/dev/null 2>&1 || packages="$packages python3-pip"
fi

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

# NVRTC (compiles crates/kernels/device/*.cu to PTX), ptxas (assembles it) and cuBLAS (its symbols are resolved)
# from PyPI: no CUDA toolkit needed.
if [ "${NEREUS_WITH_KERNEL_TOOLS:-0}" = 1 ]; then
  for wheel in nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 nvidia-cublas-cu12; do
    python3 -m pip show -q "$wheel" >/dev/null 2>&1 && continue
    echo "setup: pip installing $wheel"
    # Debian's own python refuses system-wide pip installs unless told (PEP 668).
    python3 -m pip install -q --no-deps --no-cache-dir --disable-pip-version-check "$wheel" 2>/dev/null ||
      python3 -m pip install -q --no-deps --no-cache-dir --disable-pip-version-check --break-system-packages "$wheel"
  done
fi

# hipBLAS's API as bindgen wrote it from hipblas.h (the crate hipblas-sys 0.1.0: hipBLAS 0.53,
# whose legacy GEMM API hipBLAS 2 keeps). Debian ships no hipBLAS, so CI checks the engine's
# hipBLAS names, enum values and argument widths against this declaration instead of a library.
# Kept outside target/, so that `cargo clean` does not remove it.
hipblas_api=${XDG_CACHE_HOME:-$HOME/.cache}/nereus/hipblas-api
if [ "${NEREUS_WITH_KERNEL_TOOLS:-0}" = 1 ] && [ ! -f "$hipblas_api/hipblas-sys-0.1.0/src/bindings.rs" ]; then
  echo "setup: fetching hipblas-sys 0.1.0 (hipBLAS's declarations) from crates.io"
  mkdir -p "$hipblas_api"
  curl -sSfL https://static.crates.io/crates/hipblas-sys/hipblas-sys-0.1.0.crate -o "$hipblas_api/crate.tar.gz"
  echo "37b86436ed4bbb3d66e8be840f417956f2b54bd0d1c7fd12d249c0cec9a41c98  $hipblas_api/crate.tar.gz" | sha256sum -c --quiet
  tar xzf "$hipblas_api/crate.tar.gz" -C "$hipblas_api" hipblas-sys-0.1.0/src/bindings.rs
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
features=${NEREUS_FEATURES:-}
case ",$features," in *,rocm,*) export HIP_PATH=${HIP_PATH:-/usr} ;; esac
cargo build --release --locked ${features:+--features "$features"}
