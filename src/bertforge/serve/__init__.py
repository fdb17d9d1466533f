"""Serving: an HTTP API with dynamic batching and a one-page demo (`create_app`, `serve`).

Needs the `serve` extra (fastapi, uvicorn). Example:

    from bertforge.serve import serve
    serve("runs/squad/final", port=8000)   # then open http://127.0.0.1:8000/
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

__all__ = ["create_app", "serve"]


def create_app(model_dir: str | Path | None = None, **kwargs: Any) -> FastAPI:
    """The FastAPI app for a checkpoint directory; see `bertforge.serve.app.create_app`."""
    from bertforge.serve.app import create_app as _create_app

    return _create_app(model_dir, **kwargs)


def serve(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 16,
    max_wait_ms: float = 5.0,
    device: str = "cpu",
    log_level: str = "info",
) -> None:
    """Load the checkpoint and serve the API and demo page with uvicorn until interrupted."""
    import uvicorn

    app = create_app(model_dir, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
