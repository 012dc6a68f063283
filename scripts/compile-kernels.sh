#!/usr/bin/env bash
# Compiles the device kernels on a machine without a GPU, so that a kernel that does not compile,
# or spills registers, fails here (CI runs it from scripts/test.sh). Every crates/kernels/device/*.cu,
# with its prelude.h, is compiled by
#   NVRTC   (PyPI: nvidia-cuda-nvrtc-cu12, loaded through cudarc as at run time) to PTX for
#           compute_80 and compute_90, assembled by ptxas -v (PyPI: nvidia-cuda-nvcc-cu12) for
#           sm_80 and sm_90, and to cubins by NVRTC itself;
#   hipcc   --genco --offload-arch=gfx90a (Debian's hipcc, ROCm 5.2) in crates/kernels/build.rs,
#           the code objects embedded in the binary;
#   g++     the grid emulator at warp 32 and 64 (crates/kernels/build.rs, every build), whose table
#           of parameter sizes every typed argument struct is checked against;
# and every cuBLAS symbol the engine's GEMMs use is resolved from the PyPI wheel's libcublas.so.12;
# Debian has no hipBLAS, so its symbols, GEMM argument widths and enum values are checked against
# hipBLAS's declarations (hipblas-sys 0.1.0 from crates.io, fetched by setup.sh).
#
#   NEREUS_WITH_KERNEL_TOOLS=1 bash scripts/setup.sh   # installs the tools (idempotent)
#   bash scripts/compile-kernels.sh [CARGO SELECTION…]
#
# The selection defaults to the exec and kernels crates with `cuda,rocm`; scripts/test.sh passes the
# workspace and its own features, so that the test binaries it already built are reused rather
# than rebuilt under another feature set.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kernel-env.sh
export HIP_PATH=${HIP_PATH:-/usr} NEREUS_REQUIRE_KERNEL_TOOLS=1
echo "== kernels: NVRTC $(ls "${nereus_nvrtc:-/nonexistent}"/lib/libnvrtc.so.* 2>/dev/null | head -1), ptxas ${NEREUS_PTXAS:-missing}, $(command -v hipcc || echo 'hipcc missing')"
for source in crates/kernels/device/*.cu; do echo "   $source -> compute_80, compute_90 PTX -> sm_80, sm_90; gfx90a code object; emulator w32, w64"; done
selection=("$@")
[ ${#selection[@]} -gt 0 ] || selection=(-p nereus-exec -p nereus-kernels --features nereus-exec/cuda,nereus-exec/rocm)
cargo test --release --locked "${selection[@]}" --lib -- \
  backend::cuda::tests::cuda_kernels_compile_with_nvrtc_and_assemble_with_ptxas_without_spills \
  backend::rocm::tests::the_embedded_code_object_holds_every_kernel \
  grid::tests::the_emulator_holds_every_kernel_and_nothing_else_but_its_own_probe_at_both_widths \
  grid::tests::every_typed_argument_struct_passes_the_parameters_its_kernel_declares \
  backend::cuda::tests::every_cublas_symbol_the_engine_uses_resolves \
  backend::rocm::tests::the_engines_hipblas_symbols_argument_widths_and_constants_are_hipblas_declarations
