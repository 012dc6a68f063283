#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that has a driver but neither Rust nor
# MPI (a bare compute node, a container): the `--features cuda` binary and the kernel test
# binary (stripped), and a relocatable copy of this machine's OpenMPI (Debian's 4.1) with the
# libraries it and the binaries load that are not glibc's or gcc's own. NVRTC and NCCL are not
# packed: gpu-check.sh finds the target's own (CUDA toolkit, PyTorch's wheels).
#
#   bash scripts/gpu-bundle.sh [DIR]                     # default .gpu (git-ignored), ~32 MB
#   NEREUS_PREBUILT=.gpu bash scripts/gpu-check.sh OUT   # on the GPU machine, from the repo root
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
cargo build --release --locked --features cuda 2>&1 | tail -1
test_bin=$(cargo test --release --locked -p nereus-exec --features cuda --lib --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
strip -o "$dir/bin/nereus" target/release/nereus
strip -o "$dir/bin/kernel-test" "$test_bin"
# OpenMPI relocates under OPAL_PREFIX when its paths are the prefix's; Debian's are.
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
m=$dir/mpi/usr
mkdir -p "$m/bin" "$m/lib/$arch" "$m/share"
cp /usr/bin/orterun /usr/bin/orted "$m/bin/" && ln -s orterun "$m/bin/mpirun"
for d in openmpi pmix2; do
  cp -a "/usr/lib/$arch/$d" "$m/lib/$arch/"
  rm -rf "$m/lib/$arch/$d/include" "$m/lib/$arch/$d"/lib/*.a
done
for d in openmpi pmix; do [ -d "/usr/share/$d" ] && cp -a "/usr/share/$d" "$m/share/"; done
for f in "$dir"/bin/* "$m/bin/orterun" "$m/bin/orted" $(find "$m/lib" -name '*.so*' -type f); do ldd "$f" 2>/dev/null || true; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so' |
  grep -v -E 'openmpi/lib/|pmix2/lib/' | while read -r l; do cp -L "$l" "$dir/lib/"; done
cat > "$dir/env.sh" <<ENV
# Sourced by scripts/gpu-check.sh (NEREUS_PREBUILT=$dir): the packed OpenMPI and libraries.
g=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=\$g/mpi/usr PMIX_INSTALL_PREFIX=\$g/mpi/usr/lib/$arch/pmix2
export PMIX_MCA_mca_base_component_path=\$g/mpi/usr/lib/$arch/pmix2/lib/pmix
export PATH=\$g/mpi/usr/bin:\$PATH
export LD_LIBRARY_PATH=\$g/lib:\$g/mpi/usr/lib/$arch/openmpi/lib:\$g/mpi/usr/lib/$arch/pmix2/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
# Shared memory within the node only: the packed OpenMPI has none of the fabrics' libraries.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
ENV
du -sh "$dir"
