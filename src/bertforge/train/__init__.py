"""Training: the one loop (pre-training and fine-tuning), optimisers, checkpoints, distributed set-up, logging.

    from bertforge.train import OptimConfig, TrainConfig, train
    result = train(model, batches, "runs/x", TrainConfig(max_steps=1000), OptimConfig(lr=1e-4),
                   evaluate=my_metrics, resume=True)

`model(**batch).loss` is all the loop asks of a model, and `ResumableBatches` (iterate, state_dict,
load_state_dict) all it asks of the data; `TrainState` holds what a run carries from step to step and
saves it as one checkpoint. Under torchrun the ranks share the work by DDP, or by
FSDP with `TrainConfig(parallel="fsdp")`; checkpoints are the same full files either way.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertforge.train.config import OptimConfig, TrainConfig
from bertforge.train.selection import ModelSelection

# The rest imports torch: loaded on first use, so that `from bertforge.train import OptimConfig` (the
# command line, recipes) does not.
_LAZY = {
    "distributed": None, "fsdp": None,
    "RunLogger": "log", "read_metrics": "log",
    "NonFiniteLossError": "loop", "ResumableBatches": "loop", "TrainResult": "loop",
    "first_nonfinite_module": "loop", "train": "loop",
    "Lamb": "optim", "build_optimizer": "optim", "build_scheduler": "optim", "lr_factor": "optim",
    "param_groups": "optim",
    "Counters": "state", "TrainState": "state", "latest_checkpoint": "state", "list_checkpoints": "state",
    "load_checkpoint": "state", "save_checkpoint": "state",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'bertforge.train' has no attribute {name!r}")
    module = importlib.import_module(f"bertforge.train.{_LAZY[name] or name}")
    return module if _LAZY[name] is None else getattr(module, name)


__all__ = [
    "distributed", "fsdp", "Lamb", "OptimConfig", "build_optimizer", "build_scheduler", "lr_factor", "param_groups",
    "Counters", "TrainState", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint",
    "RunLogger", "read_metrics", "ModelSelection",
    "NonFiniteLossError", "ResumableBatches", "TrainConfig", "TrainResult", "first_nonfinite_module", "train",
]
