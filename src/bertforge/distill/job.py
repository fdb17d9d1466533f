"""The distillation job: a recipe run by the module of its mode (task and general: `run.py`; sentences:
`sentences.py`). The modules are imported when a run starts, so that importing the package (the
command line's options) does not import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.distill.recipe import DistillRecipe


def distill(recipe: DistillRecipe, out_dir: str | Path, *, verbose: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Run a distillation recipe into `out_dir` (`bertforge.distill.run`: task and general;
    `bertforge.distill.sentences`: sentences); returns results.json's content."""
    if recipe.mode == "sentences":
        from bertforge.distill.sentences import distill_sentences as run
    else:
        from bertforge.distill.run import distill as run

    return run(recipe, out_dir, verbose=verbose, overwrite=overwrite)
