#!/usr/bin/env bash
# The Python the tests compare against (a test-only virtual environment, never the runtime's):
# transformers' tokenizers and chat templates (tests/data.rs) and TensorBoard's event reader
# (tests/text_job.rs), and pyarrow, which writes the Parquet files verl and `datasets` write
# (tests/data.rs). Prints the interpreter's path.
#
#   export NEREUS_TEST_PYTHON=$(bash scripts/py-test-env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
env=target/py-test
if ! "$env/bin/python" -c 'import transformers, jinja2, tensorboard, pyarrow' 2>/dev/null; then
  python3 -m venv "$env" >&2 || { python3 -m pip install -q virtualenv >&2 && python3 -m virtualenv -q "$env" >&2; }
  "$env/bin/pip" install -q --disable-pip-version-check transformers jinja2 tensorboard pyarrow >&2
fi
echo "$PWD/$env/bin/python"
