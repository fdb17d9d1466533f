"""`bertforge finetune FAMILY`: one subcommand per task family of `bertforge.tasks.FAMILIES`.

Each family's command is made from what the family declares: its help (`Task.command_help`), its own
settings as options (`Task.setting_options`), `--task` unless it is one task (`Task.single_task`),
`--data` unless it reads the user's files (`Task.reads_data_dir`); the rest are the options of
`FinetuneRecipe`. The recipe itself is built by `bertforge.finetune.build_recipe`.
"""

from __future__ import annotations

import inspect as pyinspect
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.cli.common import REVISION_HELP, TaskFamilyGroup, fail, flag, library_errors, with_revision
from bertforge.cli.options import reading_tables, recipe_command, task_setting_parameters
from bertforge.finetune import FinetuneRecipe

HELP = ("Fine-tune a pre-trained checkpoint on a task: a benchmark read from its data directory ({data_families}) "
        "or your own files ({own_data_families}), with the paper's recipe: AdamW, 10% warm-up then linear decay, "
        "batch 32, 3 epochs (on a small file, as many as 300 optimiser steps take). Every setting is an option, a line of a --config recipe (recipes/finetune/) or a --set "
        "key=value. Writes OUT/seed-N/ (a Hugging Face model; seed-N/best/ the best evaluation's), OUT/results.json "
        "(mean / std / median across seeds) and OUT/run_config.yaml (the resolved recipe).")


def family_lists() -> dict[str, str]:
    """The registered families, as HELP names them: those that read a data directory, those that read your files."""
    from bertforge.tasks import FAMILIES

    return {"data_families": ", ".join(n for n, cls in FAMILIES.items() if cls.reads_data_dir),
            "own_data_families": ", ".join(n for n, cls in FAMILIES.items() if not cls.reads_data_dir)}


_OUT = pyinspect.Parameter(
    "out", pyinspect.Parameter.KEYWORD_ONLY,
    annotation=Annotated[Path, typer.Option("--out", help="Run directory: seed-N/ models, results.json and "
                                                          "run_config.yaml (the resolved recipe).")])

_OVERWRITE = flag("overwrite", "Clear what an earlier run left in --out (its seeds, checkpoints and records) "
                              "and start again. Without it, a rerun continues --out: finished seeds are "
                              "reused and an interrupted one resumes, if the settings and inputs are the same "
                              "(else the run is refused, naming what differs).")

_REVISION = pyinspect.Parameter(
    "revision", pyinspect.Parameter.KEYWORD_ONLY, default=None,
    annotation=Annotated[str | None, typer.Option("--revision", help=REVISION_HELP)])

# `finetune ner --frozen --strategy S`: the paper's feature-based tagger instead (every layer cached once, a
# two-layer BiLSTM on each word's first piece), which bertforge.ablation builds on the CoNLL-2003 reader of
# that one family; --frozen alone, in every family, is the recipe's frozen encoder under the task's head
_FROZEN_FAMILY = "ner"
_NER_STRATEGY = [
    pyinspect.Parameter("strategy", pyinspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        str | None, typer.Option("--strategy", help="With --frozen: the paper's feature-based tagger instead "
                                                    "(bertforge ablate-features' two-layer BiLSTM on cached "
                                                    "features) on this layer strategy: embeddings, last, "
                                                    "second_to_last, sum_last_four, concat_last_four or "
                                                    "sum_all.")]),
]


def family_command(name: str, family: type) -> Any:
    """The command function of `finetune NAME`, for the task family class `family`."""
    task_params = task_setting_parameters(family.setting_options)
    skip = ("family", "task_settings", *(("task",) if family.single_task else ()),
            *(() if family.reads_data_dir else ("data",)))  # own files: --train/--dev/--test instead
    doc = family.command_help or pyinspect.getdoc(family) or f"Fine-tune on the {name} task family."

    def body(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path,
             overwrite: bool = False, strategy: str | None = None, revision: str | None = None) -> None:
        import dataclasses

        from bertforge.finetune import build_recipe, run_finetune

        try:
            recipe = build_recipe(name, config, given, assignments)
            if revision is not None:  # run_config.yaml then names the model as NAME@REVISION
                recipe = dataclasses.replace(recipe, model=with_revision(recipe.model, revision))
            if strategy is not None:
                if not recipe.train.frozen:
                    raise ValueError("--strategy goes with --frozen (the feature-based tagger)")
                return _frozen_ner(recipe, out, strategy)
            with reading_tables(recipe.quoting):  # each own file read is reported: rows in, as the run sees them
                results = run_finetune(recipe, out, overwrite=overwrite)
        except library_errors() as exc:
            raise fail(str(exc)) from exc
        _report(results, out)

    return recipe_command(name, FinetuneRecipe, body, doc=doc, skip=skip,
                          leading=[_OUT, _OVERWRITE, _REVISION, *task_params,
                                   *(_NER_STRATEGY if name == _FROZEN_FAMILY else [])],
                          leading_settings=[p.name for p in task_params])


def _report(results: dict[str, Any], out: Path) -> None:
    from bertforge.tasks.base import task_title

    typer.echo(f"{task_title(results['family'], results['task'])}: {len(results['seeds'])} seed(s), "
               f"{results['train_examples']} training examples, {results['wall_s']:.0f} s")
    splits = results.get("metric_splits", {})
    typer.echo("final models:")
    for name, row in results["summary"].items():
        named = f"{splits[name]} {name}" if name in splits and not name.startswith(f"{splits[name]}_") else name
        typer.echo(f"  {named:>24}: mean {row['mean']:.4f}  std {row['std']:.4f}  median {row['median']:.4f}")
    for split, summary in results.get("test_summary", {}).items():
        for name, row in summary.items():
            typer.echo(f"  {split + ' ' + name:>24}: mean {row['mean']:.4f}  std {row['std']:.4f}")
    if best := results.get("best_model"):  # the model to use: the best evaluation, not the last
        metric = best["metric"].removeprefix(f"{best['split']}_")
        typer.echo(f"best by {best['split']} {metric} ({best['score']:.4f}, seed {best['seed']}, step "
                   f"{best['step']}): {out / best['dir']}")
    for warning in results.get("warnings", []):
        typer.echo(f"warning: {warning}")
    typer.echo(f"wrote {out / 'results.json'}, {out / 'run_config.yaml'}")


def _frozen_ner(recipe: Any, out: Path, strategy: str) -> None:
    """`finetune ner --frozen`: the feature-based tagger on the recipe's model, data and first seed."""
    from bertforge.ablation import FrozenNerConfig, ablate
    from bertforge.features import STRATEGIES

    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if recipe.model is None or recipe.data is None:
        raise ValueError("--frozen needs --model and --data")
    (row,) = ablate(Path(recipe.model), Path(recipe.data), out, strategies=(strategy,),
                    train_sentences=recipe.train.max_train_examples, config=FrozenNerConfig(seed=recipe.seeds[0]))
    typer.echo(f"{strategy}: hidden states {row['layers']} ({row['combine']}) -> dev F1 {100 * row['dev_f1']:.2f}")


class FamilyGroup(TaskFamilyGroup):
    """The `finetune` group: a subcommand for each family in `bertforge.tasks.FAMILIES` when it is asked
    for, so that a family registered there later (by a plugin, by a test) is a command too."""

    make_command = staticmethod(family_command)

    @property
    def help(self) -> str | None:
        """The group's help text with the families registered when it is shown (`family_lists`)."""
        return None if self._help_template is None else self._help_template.format(**family_lists())

    @help.setter
    def help(self, text: str | None) -> None:
        self._help_template = text
