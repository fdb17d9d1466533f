"""Studies of what bertforge's models learn: quality runs, not speed.

Each module is a script run from the repository root as ``python -m experiments.<name>`` (for example
``python -m experiments.pretrain_vs_scratch --run runs/mini/pretrain``); raw figures go to
``experiments/results/`` and the write-ups to docs/results.md. Speed and memory against
``transformers`` are in ``benchmarks/``.
"""
