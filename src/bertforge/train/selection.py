"""Model selection: the best evaluation by one metric, and early stopping when it stops improving.

The loop (`bertforge.train.train(..., selection=...)`) shows a `ModelSelection` every evaluation's
metrics. It remembers the best score and its step, counts the evaluations since, and says when
`patience` evaluations in a row have not improved on the best, after which the loop stops. On every
improvement it calls `on_improvement(model, step, metrics)` on rank 0, where the caller saves the
model (fine-tuning writes a `best/` model directory). Its state travels in the loop's checkpoints,
so a resumed run knows the best so far and how patient it still has to be.

Torch-free: the loop passes the model through without this module touching it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

OnImprovement = Callable[[Any, int, dict[str, float]], None]  # (model, step, metrics)


@dataclass
class ModelSelection:
    """Tracks the best value of `metric` (higher is better unless `higher_is_better=False`).

    An evaluation improves when its score beats the best so far by more than `min_delta`; a
    non-finite score never does. `patience` None or 0 never stops the run.
    """

    metric: str
    patience: int | None = None
    higher_is_better: bool = True
    min_delta: float = 0.0
    on_improvement: OnImprovement | None = field(default=None, repr=False, compare=False)
    # the state, saved in checkpoints
    best_score: float | None = None
    best_step: int | None = None
    evaluations: int = 0
    since_best: int = 0  # evaluations since the best one
    stopped_at: int | None = None  # the step at which patience ran out

    def __post_init__(self) -> None:
        if self.patience is not None and self.patience < 0:
            raise ValueError(f"patience must be 0 (off) or more, got {self.patience}")
        if self.min_delta < 0:
            raise ValueError(f"min_delta must be 0 or more, got {self.min_delta}")

    def score_of(self, metrics: Mapping[str, float]) -> float:
        if self.metric not in metrics:
            raise KeyError(f"the selection metric {self.metric!r} is not among the evaluation's metrics "
                           f"({', '.join(sorted(metrics)) or 'none'})")
        return float(metrics[self.metric])

    def improves(self, score: float) -> bool:
        if not math.isfinite(score):
            return False
        if self.best_score is None:
            return True
        gain = score - self.best_score if self.higher_is_better else self.best_score - score
        return gain > self.min_delta

    def observe(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Record the evaluation made after `step`; returns whether it is the new best."""
        score = self.score_of(metrics)
        self.evaluations += 1
        improved = self.improves(score)
        if improved:
            self.best_score, self.best_step, self.since_best = score, step, 0
        else:
            self.since_best += 1
        if self.patience and self.since_best >= self.patience:
            self.stopped_at = step
        return improved

    @property
    def stopped(self) -> bool:
        """Whether patience has run out: the loop trains no further."""
        return self.stopped_at is not None

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best_score": self.best_score, "best_step": self.best_step,
                "evaluations": self.evaluations, "since_best": self.since_best, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("metric") != self.metric:
            raise ValueError(f"the checkpoint selected by {state.get('metric')!r}, this run by {self.metric!r}")
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.evaluations, self.since_best = int(state["evaluations"]), int(state["since_best"])
        self.stopped_at = state["stopped_at"]


__all__ = ["ModelSelection", "OnImprovement"]
