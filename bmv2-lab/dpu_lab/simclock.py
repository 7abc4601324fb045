"""The control plane's clock in virtual time (a dpu_limiter.clock.Clock): simulated seconds.

The control plane runs its own loops on it (lease renewals, rebalancing, holds) as it does on the wall
clock. Its timers fire only when the simulation moves time past them (`advance`): the simulation asks
`next_due` where to pause next, so that the control plane acts at the simulated instant it asked for,
in no simulated time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class SimTimer:
    """A callback set with `SimClock.call_later`."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Do not call it."""
        self.cancelled = True


class SimClock:
    """Simulated seconds from 0, and timers on them; the epoch is the wall time the run started."""

    def __init__(self, epoch: float | None = None) -> None:
        self.now = 0.0
        self.epoch = time.time() if epoch is None else epoch
        self._timers: list[tuple[float, int, SimTimer]] = []
        self._order = itertools.count()  # timers due at one instant fire in the order they were set

    def monotonic(self) -> float:
        """Simulated seconds."""
        return self.now

    def time(self) -> float:
        """The run's start on the wall clock, plus simulated seconds."""
        return self.epoch + self.now

    def call_later(self, seconds: float, callback: Callable[[], object]) -> SimTimer:
        """Call `callback` once the simulation has moved `seconds` on."""
        timer = SimTimer(callback)
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """Wait until the simulation has moved `seconds` on."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    @asynccontextmanager
    async def timeout(self, seconds: float) -> AsyncIterator[asyncio.Timeout]:
        """A block cancelled (TimeoutError) once the simulation has moved `seconds` on."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as cm:
            timer = self.call_later(seconds, lambda: cm.reschedule(loop.time()))
            try:
                yield cm
            finally:
                timer.cancel()

    def next_due(self) -> float | None:
        """When the next timer is due (simulated seconds), or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, to: float) -> int:
        """Move to `to` (never back) and fire every timer due by then, in time order; how many fired."""
        self.now = max(self.now, to)
        fired = 0
        while self._timers and self._timers[0][0] <= self.now + 1e-9:  # due within a float's rounding
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()
                fired += 1
        return fired
