"""`bertforge cache`: what bertforge keeps outside run directories, its size, and clearing it
(`bertforge.caches`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertforge.cli.common import App, fail

HELP = ("What bertforge keeps outside run directories (exported ONNX graphs, files derived from Hub data "
        "sets, the Hugging Face download cache) with sizes; `bertforge cache clear` removes it.")

UnderOption = Annotated[list[Path] | None, typer.Option(
    "--under", help="Also look for the ONNX graphs kept beside models' weights (MODEL/.bertforge-onnx) in "
                    "every folder below this one (repeat for several).")]

app = App(help=HELP, invoke_without_command=True)


@app.callback()
def _plain(ctx: typer.Context) -> None:
    """With no subcommand: the caches, their sizes and the total (as `bertforge cache list`)."""
    if ctx.invoked_subcommand is None:
        list_command(under=None)


@app.command("list")
def list_command(under: UnderOption = None) -> None:
    """List each cache bertforge uses: what it holds, its size and files, where it is, and the total.

    Example: `bertforge cache list --under runs`
    """
    from bertforge.caches import DESCRIPTIONS, KINDS, human_size

    found = _entries(KINDS, under)
    places = [str(entry.path) if entry.path.exists() else f"{entry.path} (none)" for entry in found]
    width = max(map(len, places))
    typer.echo(f"{'cache':<10}  {'size':>9}  {'files':>6}  {'where':<{width}}  what")
    for entry, where in zip(found, places, strict=True):
        typer.echo(f"{entry.kind:<10}  {human_size(entry.size):>9}  {entry.files:>6}  {where:<{width}}  "
                   f"{DESCRIPTIONS[entry.kind]}")
    typer.echo(f"{'total':<10}  {human_size(sum(e.size for e in found)):>9}  {sum(e.files for e in found):>6}")
    if not under:
        typer.echo("(ONNX graphs beside models' weights are counted with --under DIR)")


@app.command("clear")
def clear_command(
    what: Annotated[list[str] | None, typer.Option(
        "--what", help="The cache to clear: onnx, datasets, hub or model-onnx (repeat for several). Default: "
                       "bertforge's own (onnx, datasets, and model-onnx under --under); the Hugging Face "
                       "download cache, which transformers and datasets share, only when named.")] = None,
    under: UnderOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Clear without asking.")] = False,
) -> None:
    """Delete caches bertforge keeps outside run directories; each is made again when next needed.

    Example: `bertforge cache clear --what onnx --yes`
    """
    from bertforge.caches import OWN_KINDS, clear, human_size

    found = [entry for entry in _entries(what or OWN_KINDS, under) if entry.path.exists()]
    if not found:
        typer.echo("nothing to clear")
        return
    for entry in found:
        typer.echo(f"{entry.kind:<10}  {human_size(entry.size):>9}  {entry.path}")
    total = human_size(sum(entry.size for entry in found))
    if not yes and not typer.confirm(f"delete these {len(found)} folders ({total})?", default=False):
        raise fail("nothing deleted (--yes clears without asking)")
    for entry in found:
        try:
            clear(entry)
        except OSError as exc:
            raise fail(f"{entry.path}: {exc.strerror or exc}") from exc
    typer.echo(f"cleared {total}")


def _entries(kinds: list[str] | tuple[str, ...], under: list[Path] | None) -> list:
    from bertforge.caches import entries

    try:
        return entries(kinds, under or [])
    except ValueError as exc:
        raise fail(str(exc)) from exc
