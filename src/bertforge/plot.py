"""Curves of a run: training and validation loss, validation accuracies, from `RUN/metrics.jsonl` to a PNG."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from bertforge.train.log import METRICS_FILE, read_metrics


def plot_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Draw loss (left) and accuracy (right) against steps; returns the PNG path (default RUN/curves.png).

    Accuracies are every `*accuracy` metric of the evaluations (MLM, NSP/SOP, a task's); the right panel
    is left out when there is none.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    if not train and not evals:
        raise ValueError(f"{run_dir / METRICS_FILE}: no training or evaluation records to plot")
    losses = sorted({k for r in evals for k in r if k.endswith("loss")})
    accuracies = sorted({k for r in evals for k in r if k.endswith("accuracy")})

    panels = 2 if accuracies else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    loss_ax = axes[0][0]
    _line(loss_ax, train, "loss", "train loss", alpha=0.6)
    for key in losses:
        _line(loss_ax, evals, key, f"validation {key}", marker="o")
    loss_ax.set(xlabel="step", ylabel="loss", title=run_dir.name or str(run_dir))
    loss_ax.legend()
    loss_ax.grid(alpha=0.3)
    if accuracies:
        acc_ax = axes[0][1]
        for key in accuracies:
            _line(acc_ax, evals, key, f"validation {key}", marker="o")
        acc_ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="validation accuracy")
        acc_ax.legend()
        acc_ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, Path(out) if out is not None else run_dir / "curves.png")


def save_figure(fig: Any, out: str | os.PathLike[str]) -> Path:
    """Write a matplotlib figure to PNG (making the folder) and release it."""
    import matplotlib.pyplot as plt

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _line(ax: Any, records: list[dict[str, Any]], key: str, label: str, **style: Any) -> None:
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if points:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, label=label, **style)
