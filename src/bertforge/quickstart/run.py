"""The quickstart's driver: runs the stages of `settings.STAGES` in order, each writing a record
`stages/<stage>.json` when it completes; a second run reuses completed stages whose budget matches
and reruns only the rest (and every stage after the first rerun).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic
from bertforge.quickstart.report import summary_line
from bertforge.quickstart.settings import BUDGETS, STAGES, Budget
from bertforge.quickstart.stages import STAGE_FUNCTIONS, STAGE_OUTPUTS, read_record


def quickstart(
    run_dir: str | Path = "runs/quickstart",
    *,
    budget: str = "full",
    stages: Sequence[str] | None = None,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume) the quickstart; returns every stage's record. See the package docstring."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    unknown = [s for s in stages or () if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    run, settings = Path(run_dir), BUDGETS[budget]
    wanted = list(stages) if stages else list(STAGES)
    upstream_changed = False  # once a stage reruns, the stages after it cannot be reused
    for number, name in enumerate(STAGES, 1):
        if name not in wanted:
            continue
        previous = read_record(run, name)
        same_settings = previous.get("budget") == _budget_record(settings)
        if previous and same_settings and not force and not upstream_changed:
            echo(f"[{number}/{len(STAGES)}] {name}: done already ({previous['seconds']:.0f} s), reused")
            continue
        upstream_changed = True
        if previous or not same_settings:
            # A rerun starts clean; only a stage that never completed resumes (pre-training's checkpoints).
            (run / "stages" / f"{name}.json").unlink(missing_ok=True)
            for output in STAGE_OUTPUTS.get(name, ()):
                shutil.rmtree(run / output, ignore_errors=True)
        echo(f"[{number}/{len(STAGES)}] {name} ...")
        started, cpu_started, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
        record = STAGE_FUNCTIONS[name](run, settings, echo)
        # CPU seconds and the load average beside the wall time: on a shared machine they tell a slow
        # stage that waited for the cores from one that had work to do
        record |= {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
                   "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                   "budget": _budget_record(settings)}
        write_text_atomic(run / "stages" / f"{name}.json", json.dumps(record, indent=2) + "\n")
        echo(f"[{number}/{len(STAGES)}] {name}: {summary_line(name, record)} ({record['seconds']:.0f} s)")
    return {name: read_record(run, name) for name in STAGES}


def _budget_record(budget: Budget) -> dict[str, Any]:
    """The budget as a stage record keeps it: through JSON, so tuples compare as the lists read back."""
    return json.loads(json.dumps(dataclasses.asdict(budget)))
