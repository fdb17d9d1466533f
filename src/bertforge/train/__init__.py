"""Training: the one loop (pre-training and fine-tuning), optimisers, checkpoints, distributed set-up, logging.

    from bertforge.train import OptimConfig, TrainConfig, train
    result = train(model, batches, "runs/x", TrainConfig(max_steps=1000), OptimConfig(lr=1e-4),
                   evaluate=my_metrics, resume=True)

`model(**batch).loss` is all the loop asks of a model, and `ResumableBatches` (iterate, state_dict,
load_state_dict) all it asks of the data; `TrainState` holds what a run carries from step to step and
saves it as one checkpoint. Under torchrun the ranks share the work by DDP, or by
FSDP with `TrainConfig(parallel="fsdp")`; checkpoints are the same full files either way.
"""

from bertforge.train import distributed, fsdp
from bertforge.train.log import RunLogger, read_metrics
from bertforge.train.loop import (
    NonFiniteLossError,
    ResumableBatches,
    TrainConfig,
    TrainResult,
    first_nonfinite_module,
    train,
)
from bertforge.train.optim import Lamb, OptimConfig, build_optimizer, build_scheduler, lr_factor, param_groups
from bertforge.train.state import (
    Counters,
    TrainState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "distributed", "fsdp", "Lamb", "OptimConfig", "build_optimizer", "build_scheduler", "lr_factor", "param_groups",
    "Counters", "TrainState", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint",
    "RunLogger", "read_metrics",
    "NonFiniteLossError", "ResumableBatches", "TrainConfig", "TrainResult", "first_nonfinite_module", "train",
]
