#!/usr/bin/env bash
# The pure core and the planner-only binary build, and the binary runs, where MPI, hwloc and
# libclang cannot be found: a laptop that only wants `nereus plan` or `nereus simulate`. (The
# core's unit tests run with the workspace's in scripts/test.sh.)
#
#   bash scripts/test-core.sh
#
# On a machine that has them (as root), they are hidden first in a private mount namespace
# (tmpfs over their folders, /dev/null over their files); elsewhere the script checks that none
# of them is there. The build is a release build, so that the dependencies it compiles are
# reused by the rest of the suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# What rsmpi (mpicc, pkg-config ompi, mpi.h), hwloc2 (hwloc.pc, hwloc.h) and bindgen (libclang)
# would find.
hidden_dirs="/usr/lib/x86_64-linux-gnu/openmpi /usr/include/hwloc /usr/lib/llvm-14 /usr/lib/llvm-15 /usr/include/x86_64-linux-gnu/openmpi"
hidden_globs="/usr/bin/mpi* /usr/bin/ortecc /usr/bin/opal_wrapper /usr/include/hwloc.h /usr/include/mpi.h
  /usr/lib/x86_64-linux-gnu/libmpi* /usr/lib/x86_64-linux-gnu/libhwloc* /usr/lib/x86_64-linux-gnu/libclang*
  /usr/lib/x86_64-linux-gnu/libopen-* /usr/lib/x86_64-linux-gnu/pkgconfig/*mpi*.pc
  /usr/lib/x86_64-linux-gnu/pkgconfig/hwloc.pc"

present() {
  for d in $hidden_dirs; do [ -e "$d" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ] && echo "$d"; done
  for f in $hidden_globs; do [ -e "$f" ] && [ -s "$f" ] && echo "$f"; done
  return 0
}

if [ -z "${1:-}" ] && [ -n "$(present)" ]; then
  if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
    exec unshare --mount --propagation private bash "$0" --hide
  fi
  echo "test-core: MPI, hwloc or libclang are installed and cannot be hidden (needs root and unshare):" >&2
  present >&2
  exit 1
fi
if [ "${1:-}" = --hide ]; then
  for d in $hidden_dirs; do [ -d "$d" ] && mount -t tmpfs none "$d"; done
  for f in $hidden_globs; do [ -f "$f" ] && mount --bind /dev/null "$f"; done
  exec bash "$0" --hidden
fi
if [ -n "$(present)" ] || pkg-config --exists ompi 2>/dev/null || pkg-config --exists hwloc 2>/dev/null; then
  echo "test-core: MPI, hwloc or libclang are still visible:" >&2
  present >&2
  exit 1
fi
echo "== core without MPI, hwloc or libclang (none is visible here)"
cargo build --release --locked -p nereus --no-default-features

echo "== the planner-only binary plans, simulates, traces and reads GGUF files; the SPMD commands say what they need"
bin=target/release/nereus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" plan configs/llama3.1-8b-ppo.toml --gpus 64 --json >"$tmp/plan.json"
grep -q '"step_latency_s"' "$tmp/plan.json"
"$bin" inspect config | grep -q 'agreed by 1 rank'
"$bin" trace synth "$tmp/p26.csv" --shape paper26 --gpus 32 >/dev/null
"$bin" simulate configs/llama3.1-8b-ppo.toml --cluster configs/clusters/a100.toml --trace "$tmp/p26.csv" \
  --json "$tmp/sim.json" >/dev/null
grep -q '"policy": "every-k"' "$tmp/sim.json"
# model import-gguf needs no MPI: it reads the file (here not a GGUF one) and says so.
status=0
"$bin" model import-gguf configs/tiny-ppo.toml --out "$tmp/model" 2>"$tmp/err" || status=$?
if [ "$status" != 2 ] || ! grep -q "not a GGUF file" "$tmp/err"; then
  echo "test-core: \`nereus model import-gguf\` exited $status: $(cat "$tmp/err")" >&2
  exit 1
fi
for command in "train" "selftest engine" "bench planner" "logprobs x --tokens y" "inspect topology"; do
  status=0
  "$bin" $command 2>"$tmp/err" || status=$?
  if [ "$status" != 2 ] || ! grep -q "without the \`mpi\` feature" "$tmp/err"; then
    echo "test-core: \`nereus $command\` exited $status: $(cat "$tmp/err")" >&2
    exit 1
  fi
done
echo "test-core: ok"
