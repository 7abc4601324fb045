"""A fleet's agents connect (and retry) at a pace the event loop can take."""

from __future__ import annotations

import asyncio
import time

import pytest

from dpu_limiter import dataplane as dp
from dpu_limiter import finsy_adapter
from dpu_limiter.finsy_adapter import DpuSwitch
from dpu_limiter.pacing import PER_TURN, Pacer

pytestmark = pytest.mark.timeout(60)


async def test_a_burst_goes_at_once_then_the_rest_at_the_rate() -> None:
    pacer = Pacer(rate=200.0, burst=10)
    t0 = time.monotonic()
    for _ in range(10):
        await pacer.turn()
    assert time.monotonic() - t0 < 0.05  # the burst: no wait
    went: list[float] = []

    async def one() -> None:
        await pacer.turn()
        went.append(time.monotonic())

    await asyncio.gather(*(one() for _ in range(40)))
    # 40 more at 200/s: about 0.2 s, none all at once.
    assert 0.15 < went[-1] - t0 < 2.0
    assert went == sorted(went)


async def test_a_stalled_loop_does_not_let_every_waiter_go_in_one_turn() -> None:
    # More waiters than the bucket holds: however long a busy machine takes between emptying the bucket
    # and queueing them (tokens come back at 2/ms, at most `burst`), hundreds must wait in the queue.
    pacer = Pacer(rate=2_000.0, burst=1000)
    for _ in range(1000):  # the bucket emptied
        await pacer.turn()
    turns: list[int] = []
    turn = 0

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    async def one() -> None:
        await pacer.turn()
        turns.append(turn)

    counter = asyncio.create_task(count_turns())
    waiters = [asyncio.create_task(one()) for _ in range(1500)]
    await asyncio.sleep(0)
    stalled = turn
    time.sleep(0.5)  # the loop stalls: 1,000 turns' worth of tokens come due
    await asyncio.gather(*waiters)
    counter.cancel()
    after = [t for t in turns if t > stalled]
    assert len(after) >= 200 and max(after.count(t) for t in set(after)) <= PER_TURN


async def test_a_cancelled_wait_gives_its_turn_to_the_next() -> None:
    pacer = Pacer(rate=50.0, burst=1)
    await pacer.turn()
    first = asyncio.create_task(pacer.turn())
    second = asyncio.create_task(pacer.turn())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.wait_for(second, 1.0)  # one interval (20 ms), not two


def test_a_pace_needs_a_rate_and_a_burst() -> None:
    for rate, burst in ((0.0, 1), (float("inf"), 1), (float("nan"), 1), (10.0, 0)):
        with pytest.raises(ValueError):
            Pacer(rate, burst)


async def test_every_connection_attempt_waits_for_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    turns: list[str] = []

    class Counted(Pacer):
        async def turn(self) -> None:
            turns.append("turn")
            await super().turn()

    failures: list[Exception] = []
    sw = DpuSwitch(
        "d", "127.0.0.1:1", finsy_adapter.fy.SwitchOptions(), asyncio.Semaphore(1), failures.append,
        dp.limiter_program(), connects=Counted(),
    )  # fmt: skip

    async def refused(self: object) -> None:
        turns.append("attempt")
        raise ConnectionError("refused")

    monkeypatch.setattr(finsy_adapter.fy.Switch, "_run", refused)
    for _ in range(3):
        with pytest.raises(ConnectionError):
            await sw._run()
    assert turns == ["turn", "attempt"] * 3 and len(failures) == 3
