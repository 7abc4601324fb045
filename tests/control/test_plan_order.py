"""The order in which a DPU's reconcile writes a change: tighten before loosen, fewest Writes where safe.

A target may apply one Write's updates in any order, so updates share a Write only when every part
of it applied lets through no more than the state before or the state after. Window budgets and
meter cells that all loosen (or all tighten) can therefore go in one Write; a change that loosens
one and tightens the other must not.
"""

from __future__ import annotations

import dataclasses

import finsy as fy
import pytest
from finsy.proto import p4r

from dpu_limiter import dataplane as dp
from dpu_limiter.units import MeterParams


@pytest.fixture(scope="module")
def codec() -> dp.Codec:
    program = dp.limiter_program()
    return dp.Codec(fy.P4Schema(program.p4info, program.bmv2_json))


def intent(rate: int, budget: int, mult: int = 60) -> dp.Intent:
    """One DPU's intent with both cells at `rate` bytes/s and window `budget` bytes."""
    meter = MeterParams(rate, 125_000, rate, 125_000)
    return dp.Intent(
        meters=dict.fromkeys(dp.CELLS.values(), meter),
        windows=dict.fromkeys(dp.CELLS.values(), (budget, mult)),
        prefixes=("10.0.1.0/24",),
        boundary=((0, 1, 0, 1),),
    )


def holding(codec: dp.Codec, it: dp.Intent) -> dp.Held:
    """What a DPU that applied `it` reads back."""
    entities = [p4r.Entity(table_entry=te) for entries in codec.tables(it).values() for te in entries.values()]
    held = codec.held(entities)
    held.meters.update(it.meters)
    held.lease = codec.lease(it).action
    return held


def kinds(batches: list[list[p4r.Update]]) -> list[list[str]]:
    """Each batch as the kinds of entity it writes."""
    return [sorted({u.entity.WhichOneof("entity") for u in b}) for b in batches]


@pytest.mark.parametrize(
    ("before", "after"),
    [((1000, 60_000), (2000, 120_000)), ((2000, 120_000), (1000, 60_000))],
    ids=["loosen", "tighten"],
)
def test_budgets_and_meters_moving_together_share_one_write(
    codec: dp.Codec, before: tuple[int, int], after: tuple[int, int]
) -> None:
    plan = codec.plan(intent(*after), holding(codec, intent(*before)))
    assert plan.windows_with_meters
    assert kinds(plan.batches()) == [["meter_entry", "table_entry"]]
    assert len(plan.batches()[0]) == 2 * len(dp.CELLS)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((1000, 60_000), (2000, 30_000)),  # meters loosen, budgets tighten
        ((1000, 60_000, 60), (1000, 120_000, 30)),  # another window length: neither tighter nor looser
    ],
    ids=["opposite", "new-window"],
)
def test_budgets_and_meters_moving_apart_go_budget_first(
    codec: dp.Codec, before: tuple[int, ...], after: tuple[int, ...]
) -> None:
    plan = codec.plan(intent(*after), holding(codec, intent(*before)))
    assert not plan.windows_with_meters
    batches = plan.batches()
    assert kinds(batches)[0] == ["table_entry"]
    assert all(u.entity.table_entry.table_id == codec.schema.tables[dp.TABLE_WINDOW].id for u in batches[0])


def test_mixed_meter_change_keeps_budgets_apart(codec: dp.Codec) -> None:
    before, after = intent(1000, 60_000), intent(2000, 120_000)
    after.meters[0] = MeterParams(2000, 100_000, 2000, 100_000)  # a higher rate with a smaller bucket
    plan = codec.plan(after, holding(codec, before))
    assert not plan.windows_with_meters
    assert len(plan.batches()) == 2


def test_first_install_sets_budgets_before_meters(codec: dp.Codec) -> None:
    # Nothing held: new budgets tighten, unconfigured meters tighten: one Write for both is safe,
    # and it comes after the exemptions and before the crossings.
    plan = codec.plan(intent(1000, 60_000), dp.NOTHING)
    assert plan.windows_with_meters
    batches = kinds(plan.batches())
    assert batches[0] == ["meter_entry", "table_entry"]


def test_a_lease_taken_away_goes_first_alone(codec: dp.Codec) -> None:
    """A fifth red team: a new window (its slot counters afresh) written one Write before the lease was taken
    away passed 13 frames in 1.5 ms under the old lease. The revocation goes first; a lease given goes last."""
    leased = dataclasses.replace(intent(1000, 60_000, 60), lease=dp.Lease(3, 100.0, 5_000_000, 9))
    held = holding(codec, leased)
    revoked = codec.plan(intent(1000, 60_000, 30), held).batches()  # another window, and no lease (a hold)
    lease_table = codec.schema.tables[dp.TABLE_LEASE].id
    assert [u.entity.table_entry.table_id for u in revoked[0]] == [lease_table]
    assert all(u.entity.table_entry.table_id != lease_table for b in revoked[1:] for u in b)
    renewed = dataclasses.replace(leased, lease=dp.Lease(4, 110.0, 6_000_000, 9))
    granted = codec.plan(renewed, holding(codec, intent(1000, 60_000, 30))).batches()
    assert [u.entity.table_entry.table_id for u in granted[-1]] == [lease_table]
