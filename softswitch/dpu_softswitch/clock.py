"""Virtual time for the embedded target: a clock that advances only when the simulation says so.

Meters, ingress/egress timestamps and the lab's traffic sources read the same clock, so a scenario
of minutes at Gbit/s rates runs in seconds of CPU with the packet-level semantics unchanged: the
target cannot tell virtual microseconds from real ones.
"""

from __future__ import annotations

from .externs import Clock


class VirtualClock(Clock):
    """Microseconds of simulated time; set by the simulation's event loop, never by wall time."""

    realtime = False  # the simulation runs what falls due (Device.tick) when it moves time

    def __init__(self) -> None:  # no wall-clock origin, unlike Clock
        self.us = 0

    def now_us(self) -> int:
        """The current simulated time in microseconds."""
        return self.us

    def advance_to(self, us: int) -> None:
        """Move time forward (never back: meters assume a monotonic clock)."""
        if us < self.us:
            raise ValueError(f"virtual time cannot go back from {self.us} us to {us} us")
        self.us = us
