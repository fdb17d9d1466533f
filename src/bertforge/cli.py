"""The `bertforge` command line: a thin typer shell over importable library functions.

Each command parses its arguments, calls one library function and prints the result. Heavy modules
(torch, tokenizers) are imported inside the commands so that `bertforge --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="bertforge",
    help="BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving.\n\n"
    "Checkpoints are Hugging Face-format directories (config.json, model.safetensors, vocab.txt).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)


@app.callback()
def _main() -> None:
    """BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving."""


def _fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and return the exit to raise (status 2 = bad input)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=2)


# ---------------------------------------------------------------------------------------------------
# model inspection (foundation)
# ---------------------------------------------------------------------------------------------------


@app.command()
def inspect(
    model_dir: Annotated[Path, typer.Argument(help="A Hugging Face-format BERT directory.")],
) -> None:
    """Load a checkpoint and print its config, parameter count and key report.

    Example: `bertforge inspect runs/tiny/final`
    """
    from bertforge.checkpoint import CheckpointError, load_any

    try:
        model, report = load_any(model_dir)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    typer.echo(f"{type(model).__name__}  L={config.num_hidden_layers} H={config.hidden_size} "
               f"A={config.num_attention_heads} I={config.intermediate_size} vocab={config.vocab_size}")
    typer.echo(f"parameters: {n_params:,}")
    typer.echo(report.summary())


if __name__ == "__main__":  # pragma: no cover
    app()
