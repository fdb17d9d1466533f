"""Command-line options generated from recipe fields: one option per setting, plus `--config FILE` and
`--set key=value`, so that a command and its recipe cannot drift apart.

Every generated option defaults to None (not given), so that the recipe file or the field's own
default decides; the values the user gave reach the command by setting name, to be resolved by
`bertforge.recipe.resolve` like any recipe's.
"""

from __future__ import annotations

import inspect as pyinspect
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.recipe import Setting, settings_of

_CONFIG_HELP = ("A recipe (YAML) whose settings replace the defaults; options given here win over it, and "
                "--set over both. A run's own run_config.yaml repeats the run.")
_SET_HELP = "Any recipe setting as key=value, by name or path (--set lr=3e-5, --set optim.schedule=cosine; repeat)."
_CONFIG_PARAMS = [
    pyinspect.Parameter("config", pyinspect.Parameter.KEYWORD_ONLY, default=None,
                        annotation=Annotated[Path | None, typer.Option("--config", help=_CONFIG_HELP)]),
    pyinspect.Parameter("set_", pyinspect.Parameter.KEYWORD_ONLY, default=None,
                        annotation=Annotated[list[str] | None, typer.Option("--set", help=_SET_HELP)]),
]


def _option_type(hint: Any) -> Any:
    """The command-line type of a setting, or None for settings only a file or --set can give (mappings)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    if len(args) != 1:
        return None
    base = args[0]
    if base in (int, float, str, bool):
        return base
    if typing.get_origin(base) is list:
        return list[str] if typing.get_args(base) == (str,) else str  # list[int]: "1,2,3"
    return None


def _default_text(default: Any) -> str:
    if default is None or default == [] or default == {}:
        return ""
    return f" (default {','.join(map(str, default)) if isinstance(default, list) else default})"


def setting_option(name: str, kind: Any, help_text: str, *, path: str, default: Any = None,
                   aliases: Sequence[str] = ()) -> pyinspect.Parameter:
    """One keyword parameter for typer: `--batch-size` for the setting `batch_size` of type `kind`.

    It defaults to None (not given); the help ends with the setting's place in the recipe, and states
    the setting's default: in the text, or for a flag as `--flag` / `--no-flag`.
    """
    flag = name.replace("_", "-")
    if kind is bool:
        names = [f"--{flag}/--no-{flag}"]
        shown: bool | str = False if default is None else f"--{'' if default else 'no-'}{flag}"
    else:
        names, shown = [f"--{flag}", *aliases], False
    summary = (help_text.rstrip(".") + ("" if kind is bool else _default_text(default))).strip()
    text = f"{summary + '. ' if summary else ''}[recipe: {path}]"
    option = typer.Option(*names, help=text, show_default=shown)
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kind | None, option])


def recipe_parameters(recipe_cls: type, skip: Sequence[str] = ()) -> list[pyinspect.Parameter]:
    """One option per setting of `recipe_cls` that the command line can give (mappings cannot)."""
    params = []
    for setting in settings_of(recipe_cls).values():
        kind = _option_type(setting.type)
        if setting.name not in skip and kind is not None:
            params.append(_from_setting(setting, kind))
    return params


def _from_setting(setting: Setting, kind: Any) -> pyinspect.Parameter:
    return setting_option(setting.name, kind, setting.help, path=".".join(setting.path), default=setting.default,
                          aliases=setting.aliases)


def recipe_command(name: str, recipe_cls: type, body: Callable[..., None], *, doc: str,
                   leading: Sequence[pyinspect.Parameter] = (), skip: Sequence[str] = (),
                   leading_settings: Sequence[str] = ()) -> Callable[..., None]:
    """A command function for typer: the `leading` parameters, one option per recipe setting (but those
    in `skip`), then --config and --set.

    The command calls `body(given=..., config=..., assignments=..., **other leading parameters)`, with
    `given` the settings the user gave, by name: the recipe's options and the `leading_settings` (a
    task family's own, say); options left out are not in it.
    """
    generated = recipe_parameters(recipe_cls, skip)
    params = [*leading, *generated, *_CONFIG_PARAMS]
    setting_names = [*leading_settings, *(p.name for p in generated)]

    def command(**kwargs: Any) -> None:
        values = {n: kwargs.pop(n) for n in setting_names}
        given = {n: value for n, value in values.items() if value is not None}
        body(given=given, config=kwargs.pop("config"), assignments=kwargs.pop("set_") or [], **kwargs)

    command.__signature__ = pyinspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = f"{name.replace('-', '_')}_command"
    return command


def task_setting_parameters(setting_options: Mapping[str, tuple[type, str]]) -> list[pyinspect.Parameter]:
    """Options for a task family's own settings (SQuAD's --doc-stride, ...), as the family declares them;
    their defaults are the task's, so the options state none."""
    return [setting_option(name, kind, text, path=f"task_settings.{name}")
            for name, (kind, text) in setting_options.items()]


# --engine and --engine-calibrate: which engine runs the model rows of predict, serve and a dev-set run
ENGINE_HELP = ("torch (the default), onnxruntime (an ONNX graph of the model with its head, exported on first "
               "use into a cache beside the model; fp32 or int8), or auto (the faster one for the precision, "
               "this CPU's flags and the batch size, from a table filled by benchmarks/onnx_anchor.py whose "
               "unmeasured entries are marked as guesses; bf16 always runs on torch). The choice and its reason "
               "are printed.")
EngineOption = Annotated[str, typer.Option("--engine", help=ENGINE_HELP)]
EngineCalibrateOption = Annotated[bool, typer.Option(
    "--engine-calibrate", help="With --engine auto: time both engines on this machine at load instead of "
                               "reading the table (remembered per model and machine).")]


# --quoting: how the commands that read your own files read a .tsv (`bertforge.tables`)
QUOTING_HELP = ("Read .tsv files with CSV-style quoting: a cell in double quotes may hold tabs, doubled quotes "
                "and line breaks. Off by default, as TSV defines it: a line is a row and a quote is a character "
                "(as BERT's GLUE readers and pandas with quoting=QUOTE_NONE read it). .csv files are always "
                "read by RFC 4180.")
QuotingOption = Annotated[bool, typer.Option("--quoting", help=QUOTING_HELP)]
QUOTING_PARAMETER = pyinspect.Parameter("quoting", pyinspect.Parameter.KEYWORD_ONLY, default=False,
                                        annotation=QuotingOption)


@contextmanager
def reading_tables(quoting: bool) -> Iterator[None]:
    """The block of a command that reads your files: TSV quoting as --quoting says. A warning about a file
    is printed on stderr at once; the line for each file read to its end (`read FILE: N rows (...)`) when
    the block ends well, so that a refused input stays one line."""
    from bertforge.tables import table_reading

    reads: list[str] = []

    def notify(line: str) -> None:
        if line.startswith("warning:"):
            typer.secho(line, err=True, fg=typer.colors.YELLOW)
        else:
            reads.append(line)

    with table_reading(tsv_quoting=quoting, notify=notify):
        yield
    for line in reads:
        typer.echo(line, err=True)
