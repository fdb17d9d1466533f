"""Dynamic batching: requests that arrive close together run through the model as one batch.

A request puts its prepared item on a queue and awaits a future. One worker task per batcher takes
the first waiting item, then keeps collecting for at most `max_wait_ms` or until the batch holds
`max_batch_size` rows, and hands the whole batch to `run(items) -> results` on an executor thread.
Every batcher of a server shares one single-thread executor, so the model runs one batch at a time
and the event loop stays free to accept requests while it does.

Why a short wait: on a CPU a batch of 8 short sequences costs far less than 8 separate calls
(one matrix multiply instead of eight), so under concurrency a few milliseconds of waiting buys
throughput. A lone request pays the wait in full (nothing else arrives to fill the batch), which
is why the default is small; `max_batch_size=1` turns batching off and the wait with it.

An item may weigh more than one row (a long QA passage becomes several windows); `weight(item)`
says how many, and a batch is closed before it would exceed `max_batch_size` rows. If a batch
raises, each of its items is run again alone, so one bad item cannot fail the requests it was
batched with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class BatchStats:
    """Counters for /health, the tests and the load benchmark."""

    requests: int = 0  # items submitted
    batches: int = 0  # calls of `run`
    rows: int = 0  # rows (item weights) run
    largest_batch: int = 0  # most items in one call
    errors: int = 0  # items whose run raised
    sizes: dict[int, int] = field(default_factory=dict)  # items per batch -> how many batches

    def record(self, items: int, rows: int) -> None:
        self.batches += 1
        self.rows += rows
        self.largest_batch = max(self.largest_batch, items)
        self.sizes[items] = self.sizes.get(items, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "batches": self.batches, "rows": self.rows,
                "largest_batch": self.largest_batch, "errors": self.errors,
                "mean_batch": round(self.requests / self.batches, 3) if self.batches else 0.0}


class DynamicBatcher(Generic[Item, Result]):
    """Collect concurrent `submit(item)` calls into batches for `run(items) -> results` (same order)."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Result]],
        *,
        max_batch_size: int = 16,
        max_wait_ms: float = 5.0,
        executor: Executor | None = None,
        weight: Callable[[Item], int] | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.executor = executor
        self.weight = weight or (lambda item: 1)
        self.name = name
        self.stats = BatchStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]] | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """Queue one item and wait for its result (or the exception its run raised)."""
        self._ensure_worker()
        assert self._queue is not None and self._loop is not None
        future: asyncio.Future[Result] = self._loop.create_future()
        self.stats.requests += 1
        await self._queue.put((item, future))
        return await future

    def _ensure_worker(self) -> None:
        # The worker belongs to the running loop; a new loop (a test client without a lifespan, a
        # restarted server) gets a fresh queue and worker rather than one bound to a dead loop.
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._work(self._queue), name=f"{self.name}-worker")

    async def close(self) -> None:
        """Stop the worker (at server shutdown); queued requests are cancelled."""
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _work(self, queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]]) -> None:
        loop = asyncio.get_running_loop()
        held: tuple[Item, asyncio.Future[Result]] | None = None  # an item that did not fit the last batch
        while True:
            batch = [held if held is not None else await queue.get()]
            held = None
            rows = self.weight(batch[0][0])
            deadline = time.monotonic() + self.max_wait
            while rows < self.max_batch_size:
                timeout = deadline - time.monotonic()
                try:
                    entry = queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(queue.get(), timeout)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if rows + self.weight(entry[0]) > self.max_batch_size:
                    held = entry  # starts the next batch
                    break
                batch.append(entry)
                rows += self.weight(entry[0])
            live = [(item, fut) for item, fut in batch if not fut.done()]  # skip requests already cancelled
            if live:
                await self._run_batch(loop, live, rows)

    async def _run_batch(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[Item, asyncio.Future[Result]]], rows: int
    ) -> None:
        items = [item for item, _ in batch]
        self.stats.record(len(items), rows)
        try:
            results = await loop.run_in_executor(self.executor, self.run, items)
            if len(results) != len(items):
                raise RuntimeError(f"{self.name}: run returned {len(results)} results for {len(items)} items")
        except Exception as exc:  # noqa: BLE001 - handed to the waiting requests, never lost
            if len(batch) == 1:
                self.stats.errors += 1
                _settle(batch[0][1], exception=exc)
                return
            for item, future in batch:  # isolate the culprit: each item again, alone
                await self._run_batch(loop, [(item, future)], self.weight(item))
            return
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result=result)


def _settle(future: asyncio.Future[Any], *, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():  # the client went away
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
