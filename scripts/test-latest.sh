#!/usr/bin/env bash
# The test suite against the newest releases of every dependency (transformers, sentence-transformers,
# setfit, sentencepiece, tokenizers, openai, ...), in its own environment .venv-latest, leaving the
# pinned .venv alone. A failure here is a new release that changed something bertforge relies on:
# mend it, then move the pins (scripts/freeze-constraints.sh .venv-latest).
#   scripts/test-latest.sh                     the whole suite
#   scripts/test-latest.sh tests/test_x.py -x  any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
BERTFORGE_VENV=.venv-latest BERTFORGE_CONSTRAINTS=none ./setup.sh
.venv-latest/bin/python -m pip list --format=freeze 2>/dev/null \
    | grep -iE '^(transformers|sentence-transformers|setfit|sentencepiece|tokenizers|openai|pandas)==' || true
exec .venv-latest/bin/python -m pytest -q "$@"
