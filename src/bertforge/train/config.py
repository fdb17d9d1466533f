"""The training loop's settings: `OptimConfig` and `TrainConfig`, two sections of every recipe.

Plain dataclasses with no torch import, so that the command line can build its options from them
without loading torch (`bertforge --help` stays instant); `bertforge.train.optim` and
`bertforge.train.loop` act on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.recipe import setting

OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "cosine", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
PARALLEL_MODES = ("ddp", "fsdp")
DEFAULT_TIMEOUT_S = 1800.0  # how long a rank waits for the others before giving up


@dataclass
class OptimConfig:
    """The optimiser and its schedule; one section of a recipe (field names unique across sections)."""

    optimizer: str = setting("adamw", help="adamw or lamb (large batches).")
    lr: float = setting(1e-4, help="Peak learning rate.")
    weight_decay: float = setting(0.01, help="Decoupled weight decay (not on biases and LayerNorm).")
    beta1: float = setting(0.9, help="Adam's first-moment decay.")
    beta2: float = setting(0.999, help="Adam's second-moment decay.")
    adam_eps: float = setting(1e-6, help="Adam's epsilon (BERT's value; torch's default 1e-8 matters little).")
    warmup_steps: int = setting(0, help="Steps of linear warm-up.")
    warmup_ratio: float = setting(0.0, help="Warm-up as a fraction of the steps, used when warmup_steps is 0.")
    schedule: str = setting("linear", help="After warm-up: linear, cosine or constant.")
    min_lr_ratio: float = setting(0.0, help="The floor the decay ends at, as a fraction of lr.")

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.lr <= 0 or self.weight_decay < 0 or self.warmup_steps < 0 or not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"invalid optimiser settings: {self}")


@dataclass
class TrainConfig:
    """How the loop runs; one section of a recipe (field names unique across sections)."""

    max_steps: int = setting(1000, help="Optimiser steps.")
    budget_minutes: float = setting(0.0, help="Training minutes: the run ends once this much training time has "
                                              "passed, and warm-up and decay follow the time spent instead of "
                                              "the step, so the rate reaches its floor at the budget's end; "
                                              "max_steps stays a cap. 0: by steps.")
    grad_accum: int = setting(1, help="Micro-batches per optimiser step.")
    max_grad_norm: float = setting(1.0, help="Gradient clipping norm; 0 turns clipping off (the norm is still "
                                             "computed, to catch inf).")
    precision: str = setting("fp32", help="fp32, bf16 (autocast, CPU or GPU) or fp16 (autocast + GradScaler, GPU).")
    compile: bool = setting(False, help="torch.compile the model for training steps.")
    seed: int = setting(0, help="Seed; rank r seeds its RNGs with seed + r.")
    eval_every: int = setting(0, help="Steps between evaluations (0: only at the end).")
    save_every: int = setting(0, help="Steps between checkpoints (0: only at the end).")
    save_every_minutes: float = setting(0.0, help="Also write a checkpoint when this many minutes of training "
                                                  "passed since the last one (0: by steps only).")
    keep_last: int = setting(3, help="Checkpoints kept, at most (older ones are deleted; 0: all; transformers' "
                                     "save_total_limit).", aliases=("--save-total-limit",))
    log_every: int = setting(10, help="Steps between metrics.jsonl records (0: only at the end).")
    max_nonfinite: int = setting(5, help="Stop after this many skipped (non-finite) steps in a row.")
    device: str | None = setting(None, help="torch device (default: cuda:LOCAL_RANK if a GPU is visible, else cpu).")
    dist_timeout_s: float = setting(DEFAULT_TIMEOUT_S, help="Seconds a rank waits for the others before giving "
                                                            "up, with a message.")
    ddp_find_unused: bool = setting(False, help="For models whose forward leaves some parameters unused.")
    parallel: str = setting("ddp", help="Under torchrun: ddp (a model copy per rank) or fsdp (parameters, "
                                        "gradients and optimiser state sharded, for big models).")
    progress: bool = setting(True, help="The progress bar (metrics.jsonl is always written).")

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel {self.parallel!r} is not one of {PARALLEL_MODES}")
        if self.max_steps < 1 or self.grad_accum < 1 or self.max_nonfinite < 1:
            raise ValueError("max_steps, grad_accum and max_nonfinite must be at least 1")
        if self.save_every < 0 or self.save_every_minutes < 0 or self.keep_last < 0:
            raise ValueError("save_every, save_every_minutes and keep_last must be 0 or more")
        if not 0 <= self.budget_minutes < float("inf"):  # NaN fails the comparison too
            raise ValueError(f"budget_minutes must be 0 (train by steps) or a finite number of minutes, got "
                             f"{self.budget_minutes}")


__all__ = ["DEFAULT_TIMEOUT_S", "OPTIMIZERS", "PARALLEL_MODES", "PRECISIONS", "SCHEDULES", "OptimConfig",
           "TrainConfig"]
