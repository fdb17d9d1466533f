"""`bertforge search FAMILY`: the paper's grid search over fine-tuning settings (`bertforge.search.search`).

One subcommand per task family, with the options of `bertforge finetune FAMILY` (made from the same
recipe and task declarations), except that `--lr`, `--batch-size` and `--epochs` take comma-separated
lists, the grid; `--jobs` says how many configurations run at once.
"""

from __future__ import annotations

import inspect as pyinspect
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.cli.common import TaskFamilyGroup, fail, flag, library_errors
from bertforge.cli.options import recipe_command, task_setting_parameters
from bertforge.finetune import FinetuneRecipe

HELP = ("Grid-search fine-tuning settings as the BERT paper did: every learning rate x batch size x epochs "
        "(default 5e-5,4e-5,3e-5,2e-5 x 16,32 x 2,3,4), each once per seed, as ordinary fine-tuning runs in "
        "OUT/configs/ (a rerun reuses finished ones); the best mean dev score over seeds wins, its best seed is "
        "linked as OUT/model, and OUT/search.md / search.json list every configuration. --holdout N also scores "
        "the choice on N training examples that no run trained on.")

GRID_SETTINGS = ("lr", "batch_size", "epochs")


def _param(name: str, annotation: Any, default: Any = None) -> pyinspect.Parameter:
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_LEADING = [
    _param("out", Annotated[Path, typer.Option("--out", help="Search directory: configs/, model, search.md, "
                                                             "search.json.")], pyinspect.Parameter.empty),
    _param("lr", Annotated[str | None, typer.Option("--lr", help="Learning rates, comma-separated "
                                                                 "(default 5e-5,4e-5,3e-5,2e-5).")]),
    _param("batch_size", Annotated[str | None, typer.Option("--batch-size", help="Batch sizes, comma-separated "
                                                                                 "(default 16,32).")]),
    _param("epochs", Annotated[str | None, typer.Option("--epochs", help="Epochs, comma-separated (default "
                                                                         "2,3,4).")]),
    _param("jobs", Annotated[int | None, typer.Option("--jobs", help="Configurations run at once, each in its own "
                                                                     "process with its share of the cores "
                                                                     "(default: one per usable core; 1 on a GPU).")]),
    flag("overwrite", "Clear every configuration's earlier run in --out and start again. Without it a rerun "
                      "reuses finished configurations and seeds and resumes an interrupted one."),
]


def _numbers(text: str | None, kind: type, option: str) -> list[Any] | None:
    if text is None:
        return None
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated numbers, got {text!r}") from None
    if kind is int and not all(v.is_integer() for v in values):
        raise ValueError(f"{option}: expected whole numbers, got {text!r}")
    values = [kind(v) for v in values]
    if not values:
        raise ValueError(f"{option}: no values given")
    return values


def search_command(name: str, family: type) -> Any:
    """The command function of `search NAME`, for the task family class `family`."""
    task_params = task_setting_parameters(family.setting_options)
    skip = ("family", "task_settings", *GRID_SETTINGS, *(("task",) if family.single_task else ()),
            *(() if family.reads_data_dir else ("data",)))
    doc = (f"{HELP}\n\nExample: `bertforge search {name} ... --seeds 1,2,3 --holdout 500 --out runs/search` with "
           f"the options `bertforge finetune {name}` takes.")

    def body(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path, lr: str | None,
             batch_size: str | None, epochs: str | None, jobs: int | None, overwrite: bool = False) -> None:
        from bertforge.finetune import build_recipe
        from bertforge.search import PAPER_BATCH_SIZES, PAPER_EPOCHS, PAPER_LRS, SearchError, search

        try:
            recipe = build_recipe(name, config, given, assignments)
            summary = search(recipe, out, lrs=_numbers(lr, float, "--lr") or PAPER_LRS,
                             batch_sizes=_numbers(batch_size, int, "--batch-size") or PAPER_BATCH_SIZES,
                             epochs=_numbers(epochs, float, "--epochs") or PAPER_EPOCHS, jobs=jobs,
                             overwrite=overwrite)
        except (*library_errors(), SearchError) as exc:
            raise fail(str(exc)) from exc
        _report(summary, out)

    return recipe_command(name, FinetuneRecipe, body, doc=doc, skip=skip, leading=[*_LEADING, *task_params],
                          leading_settings=[p.name for p in task_params])


def _report(summary: dict[str, Any], out: Path) -> None:
    from bertforge.search import SEARCH_JSON, SEARCH_MD, markdown

    typer.echo(markdown(summary))
    typer.echo(f"wrote {out / SEARCH_MD}, {out / SEARCH_JSON}; the chosen model: {out / 'model'}")


class SearchGroup(TaskFamilyGroup):
    """The `search` group: a subcommand per family in `bertforge.tasks.FAMILIES`, made when asked for."""

    make_command = staticmethod(search_command)
