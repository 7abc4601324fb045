"""The cyclic garbage collector at fleet size: paused while a fleet's write makes its objects, and the
heap frozen once they are made.

A fleet's state and agents are millions of long-lived objects (an agent and its connection some 150).
Growing the heap that much triggers full collections over all of it, each stalling the event loop
(and every thread: a collection holds the interpreter lock) longer as the heap grows: checking and
storing a 20,000-DPU file ran some 20 full collections of 20-170 ms each.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_pauses = 0  # how many `paused` blocks are open (the event loop's: no lock needed)
_was_enabled = True  # whether the collector ran before the first of them


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection within the block (nor within any other open at the same time); the collector
    runs again after the last one, if it ran before the first. Reference counting still frees what
    is not in a cycle."""
    global _pauses, _was_enabled
    if _pauses == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()


def freeze() -> None:
    """Collect the young generations' garbage (unless the collector is paused), then move everything alive
    out of the cyclic collector's reach (gc.freeze).

    Frozen, a fleet's objects are never scanned again, and a collection only looks at what was made
    since. Within a paused block (a fleet's write) nothing is collected first: every object the write
    made is in the young generation, and collecting it scanned them all (73 ms of the event loop for
    20,000 DPUs, to find 95 objects of garbage), which stays frozen until the heap is thawed. Otherwise
    the young generations are small (milliseconds at most) and collected. A cycle that became garbage in
    the old generation since its last collection stays frozen too.
    """
    if gc.isenabled():
        gc.collect(1)
    gc.freeze()


def thaw() -> None:
    """Give everything frozen back to the collector (agents were stopped: what they held, frozen by
    `freeze`, is garbage in cycles, an agent and its connection referring to each other)."""
    if gc.get_freeze_count():
        gc.unfreeze()
