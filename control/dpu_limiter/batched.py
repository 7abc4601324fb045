"""Calls made together: many small writes of the event loop's tasks as one store transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

WAKE_BATCH = 64  # callers told their results per turn of the event loop

In = TypeVar("In")
Out = TypeVar("Out")


class Batched(Generic[In, Out]):
    """Calls of `fn(list of items) -> list of results` made together: whoever asks while a call runs
    waits for the next one, which takes everything asked meanwhile (one store transaction, not one each)."""

    def __init__(self, fn: Callable[[list[In]], list[Out]]) -> None:
        self.fn = fn
        self._pending: list[tuple[list[In], asyncio.Future[list[Out]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, items: list[In]) -> list[Out]:
        """`fn`'s results for `items`, from a call in a thread shared with the others asked for meanwhile
        (a fleet's write asks for thousands at once: one future for them all, not one each)."""
        if not items:
            return []
        future: asyncio.Future[list[Out]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await asyncio.shield(future)  # a cancelled caller leaves the batch to the others

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await asyncio.to_thread(self.fn, [item for items, _ in batch for item in items])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                at = 0
                for k, (items, future) in enumerate(batch, 1):
                    if not future.done():
                        future.set_result(results[at : at + len(items)])
                    at += len(items)
                    if k % WAKE_BATCH == 0:
                        # Each caller woken runs on at the loop's next turn: thousands at once (a fleet's
                        # share passes) would all run in one turn, and reads and lease renewals wait for it.
                        await asyncio.sleep(0)
