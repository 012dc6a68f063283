# Sourced by scripts/compile-kernels.sh and scripts/gpu-check.sh: makes the CUDA pieces that
# PyPI ships loadable without a CUDA toolkit. Each is used only when installed:
#   nvidia-cuda-nvrtc-cu12  libnvrtc.so.12   -> LD_LIBRARY_PATH (NVRTC compiles crates/kernels/device/*.cu)
#   nvidia-cuda-nvcc-cu12   ptxas            -> NEREUS_PTXAS (assembles the PTX for sm_80/sm_90)
#   nvidia-cublas-cu12      libcublas.so.12  -> LD_LIBRARY_PATH (the GEMM symbols are resolved in CI)
#   nvidia-nccl-cu12        libnccl.so.2     -> LD_LIBRARY_PATH (the NCCL binding loads by soname)
#   hipblas-sys (crates.io) bindings.rs      -> NEREUS_HIPBLAS_API (hipBLAS's declarations)
py=${PYTHON:-python3}
pkg_dir() { "$py" -c "import importlib.util as u, os; s = u.find_spec('nvidia.$1'); print(os.path.dirname(s.origin) if s and s.origin else (list(s.submodule_search_locations)[0] if s else ''))" 2>/dev/null || true; }
nereus_nvrtc=$(pkg_dir cuda_nvrtc)
if [ -n "$nereus_nvrtc" ] && [ -d "$nereus_nvrtc/lib" ]; then
  export LD_LIBRARY_PATH="$nereus_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nereus_nvcc=$(pkg_dir cuda_nvcc)
if [ -n "$nereus_nvcc" ] && [ -x "$nereus_nvcc/bin/ptxas" ]; then
  export NEREUS_PTXAS="$nereus_nvcc/bin/ptxas"
elif command -v ptxas >/dev/null; then
  export NEREUS_PTXAS=$(command -v ptxas)
fi
nereus_cublas=$(pkg_dir cublas)
if [ -n "$nereus_cublas" ] && [ -e "$nereus_cublas/lib/libcublas.so.12" ]; then
  export LD_LIBRARY_PATH="$nereus_cublas/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nereus_nccl=$(pkg_dir nccl)
if [ -n "$nereus_nccl" ] && [ -e "$nereus_nccl/lib/libnccl.so.2" ]; then
  export LD_LIBRARY_PATH="$nereus_nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# hipBLAS's declarations (fetched by setup.sh): the engine's hipBLAS ABI is checked against them.
nereus_hipblas_api=${XDG_CACHE_HOME:-$HOME/.cache}/nereus/hipblas-api/hipblas-sys-0.1.0/src/bindings.rs
if [ -f "$nereus_hipblas_api" ]; then
  export NEREUS_HIPBLAS_API="$nereus_hipblas_api"
fi
unset -f pkg_dir
