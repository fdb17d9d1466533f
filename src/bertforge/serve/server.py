"""Running the server: `serve` loads a checkpoint and runs the API with uvicorn; `create_app` makes the
FastAPI app without importing fastapi before it is asked for (`bertforge.serve.app` builds it);
`bound_kernel_cache` bounds oneDNN's per-shape kernel cache for a long-running process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

# oneDNN keeps compiled kernels per input shape (1024 by default). A server sees a new shape with
# almost every batch (batch size x real tokens), so its memory grows for a long time before that
# cache fills: all-MiniLM-L6-v2, 600 random batches of 1-16 sentences, RSS 373 -> 494 MB and still
# rising with the default, 371 -> 439 MB and level with 64, 370 -> 391 MB with 0. The cost, a kernel
# built again for a shape that left the cache, was lost in the noise of our timings.
KERNEL_CACHE_CAPACITY = "64"


def bound_kernel_cache() -> None:
    """Bound oneDNN's per-shape kernel cache, unless the user set ONEDNN_PRIMITIVE_CACHE_CAPACITY.

    Takes effect only if called before the process runs its first model call.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", KERNEL_CACHE_CAPACITY)


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
    precision: str = "fp32",
    log_level: str = "info",
    access_log: bool = True,
    max_body_bytes: int = 1_000_000,
    body_timeout_s: float = 10.0,
    max_connections: int = 512,
    engine: str = "torch",
) -> None:
    """Load the checkpoint and serve the API and demo page with uvicorn until interrupted.

    `precision`: fp32, bf16, int8 or auto (`bertforge.precision`); `engine`: torch, onnxruntime or auto
    (`bertforge.engine`). A request body is read whole, at most
    `max_body_bytes`, with no pause longer than `body_timeout_s`; at most `max_connections` are served at
    once (503 beyond) and idle keep-alive connections close after 5 s."""
    import uvicorn

    bound_kernel_cache()
    app = create_app(model_dir, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device,
                     precision=precision, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s,
                     engine=engine)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log,
                limit_concurrency=max_connections, timeout_keep_alive=5)
