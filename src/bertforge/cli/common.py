"""What the command modules share: the app, command and group classes every command is made with, the
one-line error exit, the errors a library call reports as bad input, and small argument helpers."""

from __future__ import annotations

import functools
import inspect as pyinspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

PRECISION_HELP = ("fp32, bf16, int8 (dynamic quantization of the encoder's Linear layers) or auto "
                  "(bf16 where the CPU has AMX or AVX512-BF16, else fp32).")


class _FlagsTakeNoValue:
    """typer's rich help prints a value placeholder after every option, flags too (`--all-scores <bool>`,
    `--help <bool>`), though a flag takes no value (its plain-text help already prints none). Here a
    flag's placeholder is empty; valued options keep theirs (`<int>`, `<path>`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:  # --help included: get_params adds it to the command's own
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # the placeholder typer prints, where one is set
        return params


class Command(_FlagsTakeNoValue, TyperCommand):
    """A `bertforge` command: typer's, with flags shown without a value placeholder."""


class Group(_FlagsTakeNoValue, TyperGroup):
    """A `bertforge` command group: typer's, with flags shown without a value placeholder."""


class App(typer.Typer):
    """A typer app whose group and commands are `Group` and `Command` unless a `cls` says otherwise
    (which should derive from them), so that every command's help reads the same."""

    def __init__(self, *args: Any, cls: type[TyperGroup] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, cls=cls or Group, **kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,  # type: ignore[override]
                **kwargs: Any) -> Any:
        return super().command(name, cls=cls or Command, **kwargs)


def fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and return the exit to raise (status 2 = bad input)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=2)


MODEL_NAME_HELP = " Or a Hugging Face Hub model: org/name, or org/name@revision (a branch, tag or commit)."


REVISION_HELP = ("With a Hub model name: the branch, tag or commit to use (the same as NAME@REVISION). "
                 "Default: the repository's main branch.")
RevisionOption = Annotated[str | None, typer.Option("--revision", help=REVISION_HELP)]


def with_revision(model: str | Path | None, revision: str | None) -> str | None:
    """`model` with `--revision` folded in as `NAME@REVISION` (`bertforge.hub.with_revision`); a refusal
    is the one-line error exit."""
    if model is None:
        return None
    from bertforge.hub import HubModelError
    from bertforge.hub import with_revision as fold

    try:
        return fold(str(model), revision)
    except HubModelError as exc:
        raise fail(str(exc)) from exc


def hub_model(value: Path | None, revision: str | None = None) -> Path | None:
    """A --model value as the directory to read: a Hub name (`org/name[@revision]`, not an existing
    directory; `revision` from --revision) becomes its snapshot in the Hugging Face cache (`bertforge.hub`)."""
    if value is None:
        return None
    from bertforge.hub import HubModelError, local_or_hub

    try:
        return local_or_hub(with_revision(value, revision) or value)
    except HubModelError as exc:
        raise fail(str(exc)) from exc


def library_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which the library reports bad input (a file, a setting, a checkpoint)."""
    from bertforge.checkpoint import CheckpointError
    from bertforge.data.corpus import DataError
    from bertforge.tasks.base import DataFormatError

    # OSError: a missing file, a read-only or full disk, a permission: one line naming the path
    return (CheckpointError, DataError, DataFormatError, OSError, ValueError)


def flag(name: str, help_text: str) -> pyinspect.Parameter:
    """A keyword parameter for an off-by-default `--NAME` flag."""
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY, default=False,
                               annotation=Annotated[bool, typer.Option(f"--{name}", help=help_text)])


def required_path(name: str, help_text: str) -> pyinspect.Parameter:
    """A keyword parameter for a required `--NAME PATH` option."""
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY,
                               annotation=Annotated[Path, typer.Option(f"--{name}", help=help_text)])


def text_lines(path: Path, pairs: bool) -> list[str | tuple[str, str]]:
    """Every line of a UTF-8 file (blank ones too, to keep line numbers); "a ||| b" as a pair with `pairs`."""
    from bertforge.fileio import NotUtf8Error, decode_utf8

    try:
        lines = decode_utf8(path.read_bytes(), path).splitlines()
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}") from exc
    except NotUtf8Error as exc:
        raise fail(str(exc)) from None
    if not pairs:
        return list(lines)
    out: list[str | tuple[str, str]] = []
    for line in lines:
        first, sep, second = line.partition(" ||| ")
        out.append((first, second) if sep else line)
    return out


class TaskFamilyGroup(Group):
    """A command group with a subcommand for each family in `bertforge.tasks.FAMILIES`, made when it is
    asked for, so that a family registered later (by a plugin, by a test) is a command too. A subclass
    names the factory that makes one family's command function (`make_command(name, family)`)."""

    make_command: ClassVar[Callable[[str, type], Callable[..., None]]]

    def list_commands(self, ctx: Any) -> list[str]:
        from bertforge.tasks import FAMILIES

        return list(FAMILIES)

    def get_command(self, ctx: Any, name: str) -> Any:
        from bertforge.tasks import FAMILIES

        if name not in FAMILIES:
            return None
        return _family_command(type(self).make_command, name, FAMILIES[name], self.rich_markup_mode)


@functools.cache
def _family_command(make: Callable[[str, type], Callable[..., None]], name: str, family: type, markup: Any) -> Any:
    single = App(add_completion=False, rich_markup_mode=markup)
    single.command(name)(make(name, family))
    return typer.main.get_command(single)
