"""Serving: an HTTP API with dynamic batching and a one-page demo (`create_app`, `serve`).

Needs the `serve` extra (fastapi, uvicorn). Example:

    from bertforge.serve import serve
    serve("runs/squad/seed-1", port=8000)   # then open http://127.0.0.1:8000/
"""

from bertforge.serve.server import KERNEL_CACHE_CAPACITY, bound_kernel_cache, create_app, serve

__all__ = ["KERNEL_CACHE_CAPACITY", "bound_kernel_cache", "create_app", "serve"]
