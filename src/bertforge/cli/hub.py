"""`bertforge push DIR org/name`: publish a model directory on the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertforge.cli.common import fail


def push_command(
    directory: Annotated[Path, typer.Argument(help="The model directory: a fine-tuned seed-N, a pre-trained "
                                                   "final/, an adapted or distilled model.")],
    repo_id: Annotated[str, typer.Argument(help="The Hub repository to create or update: org/name.")],
    public: Annotated[bool, typer.Option("--public", help="Create the repository public (default: private).")] = False,
    message: Annotated[str | None, typer.Option("--message", help="The commit message.")] = None,
) -> None:
    """Upload a model directory to the Hugging Face Hub (private unless --public), its resumable
    checkpoints and run records left out; a model card (README.md with the Hub's metadata and the dev
    scores) is written first when the directory has none. The token is HF_TOKEN or `hf auth login`'s.

    Example: `bertforge push runs/reviews/seed-1 my-org/reviews-minilm`
    """
    from bertforge.hub import HubModelError, reaching_hub
    from bertforge.modelcard import push_model

    try:
        # a network failure or an error status is one line saying what failed and what to do
        with reaching_hub(f"push {directory} to {repo_id}"):
            url = push_model(directory, repo_id, private=not public, message=message)
    except HubModelError as exc:
        raise fail(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise fail(f"push {directory} to {repo_id}: {exc}") from exc
    typer.echo(f"{directory} -> {url} ({'public' if public else 'private'})")
