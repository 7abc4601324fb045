"""Time as the control plane's policy reads it and waits on it: leases, holds, read-back periods,
rebalancing. The wall clock by default; a simulation gives its own (the lab's virtual time), so that the
same service loops run in both clocks.

Waits on I/O (a P4Runtime round trip, a clock echo, a DPU confirming a write) are not policy: they stay
on the event loop's own timeouts, which bound real work whatever the clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol


class Timer(Protocol):
    """A callback set with `Clock.call_later`."""

    def cancel(self) -> None:
        """Do not call it."""


class Clock(Protocol):
    """What the control plane reads and waits on."""

    def monotonic(self) -> float:
        """Seconds, for intervals and deadlines: never goes back."""

    def time(self) -> float:
        """Seconds since the epoch: what is stored for a control plane that starts later."""

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock."""

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """Call `callback` once `seconds` of this clock have passed."""

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        """A block cancelled (raising TimeoutError) after `seconds` of this clock, as asyncio.timeout."""


@dataclass(frozen=True)
class WallClock:
    """The host's clocks and the event loop's timers."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def time(self) -> float:
        """time.time()."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep."""
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """The running loop's call_later."""
        return asyncio.get_running_loop().call_later(seconds, callback)

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        """asyncio.timeout."""
        return asyncio.timeout(seconds)


WALL = WallClock()
