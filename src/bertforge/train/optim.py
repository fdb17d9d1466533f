"""Optimisers and learning-rate schedules: BERT's weight-decay exclusions, AdamW, LAMB, warm-up + decay.

BERT (Devlin et al., 2019) trains with Adam and decoupled weight decay 0.01 applied to every weight
matrix but not to biases or LayerNorm parameters; the learning rate warms up linearly, then decays
linearly to zero. LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") rescales each
tensor's Adam update by a trust ratio ||w|| / ||update||, which keeps very large batches stable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from bertforge.train.config import OPTIMIZERS, SCHEDULES, OptimConfig  # noqa: F401  (re-exported)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases + LayerNorm parameters that do not.

    Decay pulls a parameter towards zero; for a LayerNorm gain that means towards switching the layer
    off, and biases have no scale to regularise, hence BERT's exclusion (its "LayerNorm", "bias" list).
    Parameters shared between modules (tied or ALBERT-style) appear once.
    """
    no_decay: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, nn.LayerNorm) or name == "bias" or name.endswith("_bias"):
                no_decay.add(id(param))
    decay, keep = [], []
    for param in model.parameters():  # unique parameters, in a fixed order (the optimiser state keys on it)
        if param.requires_grad:
            (keep if id(param) in no_decay else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019, Algorithm 2) with the identity scaling function phi.

    Per tensor x with gradient g, at step t:
        m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
        r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
        u = r + weight_decay * x
        x = x - lr * (||x|| / ||u||) * u      (trust ratio 1 where either norm is 0)
    A zero norm arises for freshly zeroed biases; ratio 1 lets them move at the plain Adam rate.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.float()
                state = self.state[param]
                if not state:
                    # the step is a tensor, as in torch's Adam, so the state dict holds tensors only
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                state["step"] += 1
                t = state["step"].item()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq / (1 - beta2**t)).sqrt_().add_(group["eps"])
                update = (exp_avg / (1 - beta1**t)).div_(denom)
                weights = param.float()
                if group["weight_decay"]:
                    update.add_(weights, alpha=group["weight_decay"])
                w_norm, u_norm = weights.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                param.add_((update * (-group["lr"] * trust)).to(param.dtype))
        return loss


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, config.weight_decay)
    betas = (config.beta1, config.beta2)
    if config.optimizer == "lamb":
        return Lamb(groups, lr=config.lr, betas=betas, eps=config.adam_eps)
    return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.adam_eps, fused=_can_fuse(groups) or None)


def _can_fuse(groups: list[dict]) -> bool:
    """Whether torch's fused AdamW (one kernel over every tensor) takes these parameters.

    It does for floating-point parameters on the CPU or a GPU, FSDP's sharded ones included, and its
    step is much cheaper than the default multi-tensor one on the CPU: 41 vs 157 ms for
    all-MiniLM-L6's 22.7M parameters on one core (transformers' Trainer uses it too). A checkpoint
    keeps the choice in its param groups, so a run resumes with the kernel it started with.
    """
    params = [param for group in groups for param in group["params"]]
    return bool(params) and all(param.device.type in ("cpu", "cuda") and param.is_floating_point() for param in params)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str = "linear",
              min_ratio: float = 0.0) -> float:
    """The multiplier of the peak learning rate for the update made at `step` (0-based).

    Warm-up rises linearly to 1 at `warmup_steps` (the first update already gets a small non-zero
    rate, 1 / warmup_steps); the decay then goes from 1 to `min_ratio` at `total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return _decayed((step - warmup_steps) / max(1, total_steps - warmup_steps), schedule, min_ratio)


def lr_factor_by_time(fraction: float, *, warmup_fraction: float, schedule: str = "linear",
                      min_ratio: float = 0.0) -> float:
    """The multiplier of the peak learning rate for an update made once `fraction` of the training
    budget was spent (the time before the update: the step schedule's 0-based index on the time axis).

    `lr_factor`'s shape over time: warm-up rises linearly to 1 at `warmup_fraction`, the decay then goes
    from 1 to `min_ratio` at fraction 1 and stays there (a run's last step starts before the budget's
    end, so its rate is just above the floor). Under a warm-up by time the first update gets rate 0:
    no time has passed before it.
    """
    if fraction < warmup_fraction:
        return fraction / warmup_fraction
    return _decayed((fraction - warmup_fraction) / (1.0 - warmup_fraction), schedule, min_ratio)


def _decayed(progress: float, schedule: str, min_ratio: float) -> float:
    """After warm-up: 1 at `progress` 0, falling to `min_ratio` at 1 and after (constant: 1 throughout)."""
    if schedule == "constant":
        return 1.0
    progress = min(1.0, progress)
    decayed = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * decayed


@dataclass
class TimeBudget:
    """A run's training-time budget and the training seconds spent so far: the cell a schedule by
    time reads. The loop sets `spent` from the run's counters (which checkpoints carry) before each
    rate is computed, so the scheduler's own state dict stays numbers only."""

    seconds: float
    spent: float = 0.0

    @property
    def fraction(self) -> float:
        return self.spent / self.seconds

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.seconds


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int, budget: TimeBudget | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `lr_factor`, or with a `budget` over `lr_factor_by_time` (the fraction of it spent).

    A closure (not an object) so that its state dict holds only numbers and a resumed run with a longer
    `max_steps` (or budget) follows the new schedule, not the saved one. With a budget, a warm-up in
    steps (`warmup_steps`) stays in steps, rising to the time decay, which then runs over the whole
    budget; `warmup_ratio` is a fraction of the budget.
    """
    warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)

    def by_step(step: int) -> float:
        return lr_factor(step, warmup_steps=warmup, total_steps=total_steps, schedule=config.schedule,
                         min_ratio=config.min_lr_ratio)

    if budget is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, by_step)
    spent: TimeBudget = budget  # not Optional inside the closure
    warmup_fraction = 0.0 if config.warmup_steps else config.warmup_ratio

    def by_time(step: int) -> float:
        rate = lr_factor_by_time(spent.fraction, warmup_fraction=warmup_fraction, schedule=config.schedule,
                                 min_ratio=config.min_lr_ratio)
        # min, not the ramp alone: the step warm-up meets the decay where it is, with no jump down to it
        return min(rate, by_step(step)) if step < config.warmup_steps else rate

    return torch.optim.lr_scheduler.LambdaLR(optimizer, by_time)
