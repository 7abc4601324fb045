"""How fast a fleet's agents open connections: a shared pace for every attempt.

Opening a P4Runtime connection costs the event loop ~0.45 ms (a gRPC channel, a stub, a stream,
arbitration), all of it on the loop. A fleet's write starts 20,000 agents at once: opening all their
connections back to back took the loop ~10 s, GetStatus and lease renewals waiting between. Each
attempt now waits for its turn at a bounded rate, a few per turn of the loop (Pacer); so do retries
(finsy tries again 10 s after an attempt that failed fast: DPUs that failed together would all come
back together).
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable

from .units import CONNECT_BURST, CONNECTS_PER_S

PER_TURN = 16  # waiters let go per turn of the loop at most (~7 ms of connecting)


class Pacer:
    """At most `rate` turns per second on average and `burst` at once, first come first served: a token
    bucket whose waiters are let go by one task, at most PER_TURN of them per turn of the event loop.

    Self-clocked, not scheduled ahead: waiters given a time each would all be due after a stall of the
    loop, and go at once, stalling it longer.
    """

    def __init__(self, rate: float = CONNECTS_PER_S, burst: int = CONNECT_BURST) -> None:
        if not (math.isfinite(rate) and rate > 0) or burst < 1:
            raise ValueError(f"a pace needs a rate > 0 and a burst >= 1 (got {rate!r}, {burst!r})")
        self.interval = 1.0 / rate
        self.burst = burst
        self._tokens = float(burst)
        self._counted_at: float | None = None  # the event loop's time the tokens were last counted
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._releaser: asyncio.Task[None] | None = None
        self.on_let_go: Callable[[int], None] | None = None  # told how many waiters a turn let go

    def _refill(self, now: float) -> None:
        if self._counted_at is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._counted_at) / self.interval)
        self._counted_at = now

    async def turn(self) -> None:
        """Wait for this caller's turn (a cancelled wait gives it up)."""
        loop = asyncio.get_running_loop()
        self._refill(loop.time())
        if not self._waiting and self._tokens >= 1:
            self._tokens -= 1
            return
        future: asyncio.Future[None] = loop.create_future()
        self._waiting.append(future)
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.create_task(self._release(), name="pacer")
        await future

    async def _release(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            await asyncio.sleep(self.interval)
            self._refill(loop.time())
            let_go = went = min(int(self._tokens), PER_TURN)
            while let_go > 0 and self._waiting:
                future = self._waiting.popleft()
                if not future.done():  # not cancelled (its agent stopped)
                    future.set_result(None)
                    self._tokens -= 1
                    let_go -= 1
            if self.on_let_go is not None and went > let_go:
                self.on_let_go(went - let_go)
