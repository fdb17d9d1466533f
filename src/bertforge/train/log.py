"""What a run reports: a tqdm progress bar (loss, tokens/s, ETA), metrics as JSONL, TensorBoard if installed.

`RUN/metrics.jsonl` holds one JSON object per line: `{"step": 100, "split": "train", "loss": ...}`,
`"split": "eval"` for evaluations and `"split": "run"` for one-off facts (effective batch, parameters).
Only rank 0 writes. `bertforge plot RUN` draws the curves from this file.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from bertforge.fileio import write_text_atomic

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of `RUN/metrics.jsonl` (a torn last line, from a killed run, is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class RunLogger:
    """Progress bar + JSONL + optional TensorBoard for one run; a silent no-op where `enabled` is False."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, *, total_steps: int, start_step: int = 0,
                 enabled: bool = True, progress: bool = True, tensorboard: bool = True) -> None:
        self.enabled = enabled and run_dir is not None
        self.path = Path(run_dir) / METRICS_FILE if run_dir is not None else None
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                        mininterval=1.0, disable=not (enabled and progress), file=sys.stderr)
        self.writer = None
        if self.enabled:
            Path(run_dir).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
            self._drop_records_after(start_step)
            if tensorboard:
                self.writer = _tensorboard_writer(Path(run_dir) / "tensorboard", start_step)  # type: ignore[arg-type]

    def _drop_records_after(self, step: int) -> None:
        """A resumed run repeats the steps after its checkpoint; their old records would double the curves."""
        records = read_metrics(self.path.parent) if self.path is not None else []
        kept = [r for r in records if r.get("step", 0) <= step]
        if self.path is not None and len(kept) != len(records):
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, step: int, split: str, metrics: dict[str, Any]) -> None:
        if not self.enabled or self.path is None:
            return
        record = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=_jsonable) + "\n")
        if self.writer is not None and split != "run":  # one-off facts are no curves
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(f"{split}/{key}", value, step)

    def progress(self, step: int, metrics: dict[str, float], total: int | None = None) -> None:
        """Move the bar to `step` and show the latest numbers; tqdm supplies the rate and the ETA.
        `total`, the steps the run is now expected to take (a time budget's estimate), moves the ETA."""
        if total is not None:
            self.bar.total = total
        self.bar.update(step - self.bar.n)
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in metrics.items()}
        self.bar.set_postfix(shown, refresh=False)

    def info(self, message: str) -> None:
        """A line above the progress bar (rank 0 only)."""
        if self.enabled:
            self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _tensorboard_writer(directory: Path, start_step: int) -> Any:
    """A SummaryWriter (`pip install bertforge[tensorboard]`), or None without the package.

    A resumed run repeats the steps after its checkpoint: `purge_step` hides the first run's events
    from there on, as `_drop_records_after` does for the JSONL file, so no curve doubles back.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional; the JSONL file has the same numbers
        return None
    return SummaryWriter(str(directory), purge_step=start_step + 1 if start_step > 0 else None)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # a 0-d tensor or NumPy scalar that slipped through
        return value.item()
    return str(value)
