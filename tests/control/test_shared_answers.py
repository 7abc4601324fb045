"""api.Shared: an answer made once for every caller that asks while it is fresh (the whole fleet's GetStatus,
tests/control/test_apply_scale.py measures it through gRPC)."""

from __future__ import annotations

import asyncio

import pytest

from dpu_limiter.api import Shared


class Maker:
    """Makes numbered answers, each said to have cost `cost` seconds; can be held mid-make, or fail."""

    def __init__(self, cost: float = 0.0) -> None:
        self.cost, self.made, self.fail = cost, 0, False
        self.hold = asyncio.Event()
        self.hold.set()

    async def __call__(self) -> tuple[int, float]:
        await self.hold.wait()
        if self.fail:
            raise RuntimeError("the store is away")
        self.made += 1
        return self.made, self.cost


async def test_callers_that_ask_while_it_is_made_wait_for_that_one() -> None:
    shared, make = Shared[int](0.1, 1.0), Maker()
    make.hold.clear()
    waiting = [asyncio.create_task(shared.get("k", make)) for _ in range(5)]
    await asyncio.sleep(0)
    make.hold.set()
    assert await asyncio.gather(*waiting) == [1] * 5 and make.made == 1


async def test_an_answer_is_kept_nine_times_what_it_cost_at_a_tenth_of_the_loop() -> None:
    shared, make = Shared[int](0.1, 1.0), Maker(cost=0.02)  # kept 0.18 s
    assert await shared.get("k", make) == 1
    assert await shared.get("k", make) == 1
    await asyncio.sleep(0.25)
    assert await shared.get("k", make) == 2


async def test_no_answer_is_kept_longer_than_its_max_age() -> None:
    shared, make = Shared[int](0.1, 0.1), Maker(cost=5.0)  # would be 45 s
    assert await shared.get("k", make) == 1
    await asyncio.sleep(0.15)
    assert await shared.get("k", make) == 2


async def test_a_new_key_is_made_at_once() -> None:
    # GetStatus's key is the state's generation (and the log's head): a write is seen by the next call.
    shared, make = Shared[int](0.1, 1.0), Maker(cost=1.0)
    assert await shared.get(1, make) == 1
    assert await shared.get(2, make) == 2
    assert await shared.get(2, make) == 2


async def test_an_answer_for_an_old_key_made_last_does_not_keep_the_new_one() -> None:
    old, new = Maker(cost=10.0), Maker(cost=0.0)
    shared = Shared[int](0.1, 1.0)
    old.hold.clear()
    first = asyncio.create_task(shared.get(1, old))
    await asyncio.sleep(0)
    assert await shared.get(2, new) == 1  # made at once, kept for no time
    old.hold.set()
    assert await first == 1  # its answer, made last, is kept for no key
    assert await shared.get(2, new) == 2


async def test_a_caller_that_gives_up_does_not_cancel_the_others_answer() -> None:
    shared, make = Shared[int](0.1, 1.0), Maker()
    make.hold.clear()
    quitter, stayer = (asyncio.create_task(shared.get("k", make)) for _ in range(2))
    await asyncio.sleep(0)
    quitter.cancel()
    make.hold.set()
    assert await stayer == 1
    with pytest.raises(asyncio.CancelledError):
        await quitter


async def test_a_failed_make_is_not_kept() -> None:
    shared, make = Shared[int](0.1, 1.0), Maker(cost=1.0)
    make.fail = True
    with pytest.raises(RuntimeError, match="store is away"):
        await shared.get("k", make)
    make.fail = False
    assert await shared.get("k", make) == 1
