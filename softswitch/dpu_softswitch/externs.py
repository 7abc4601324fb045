"""Stateful P4 objects with bmv2's semantics: counters, meters (trTCM token arithmetic), registers."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

# bmv2 meter colours (v1model V1MODEL_METER_COLOR_*).
GREEN, YELLOW, RED = 0, 1, 2

# PI hands bmv2 burst sizes as uint32 (pi_meter_spec_t): larger P4Runtime bursts wrap.
PI_BURST_MASK = (1 << 32) - 1

# An unconfigured meter's tokens: never written to (set_rates gives a configured cell lists of its own).
_NO_TOKENS: list[int] = []


class Clock:
    """Microseconds on a monotonic clock, counted from the clock's creation (bmv2's time origin)."""

    realtime = True  # it moves by itself, so timeouts on it can be waited for in wall-clock time

    def __init__(self, running_s: float = 0.0) -> None:
        """A clock that reads `running_s` seconds now, as a target started that long ago would."""
        self._origin = time.monotonic_ns() - int(running_s * 1e9)

    def now_us(self) -> int:
        """Microseconds since the origin."""
        return (time.monotonic_ns() - self._origin) // 1000


class CounterArray:
    """An indexed packets-and-bytes counter array.

    Its cells are allocated when first used (counted, read or written), not before: a process that runs
    thousands of devices (bench/targets_host.py) holds only the arrays their packets and controllers touch.
    Once allocated, `packets` and `bytes` are the instance's own attributes (reset() drops them again).
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size

    @functools.cached_property
    def packets(self) -> list[int]:
        """Packets counted, by cell."""
        return [0] * self.size

    @functools.cached_property
    def bytes(self) -> list[int]:
        """Bytes counted, by cell."""
        return [0] * self.size

    def count(self, index: int, length: int) -> None:
        """Count one packet of `length` bytes at `index` (out of range: ignored, as bmv2 logs and skips)."""
        if 0 <= index < self.size:
            self.packets[index] += 1
            self.bytes[index] += length

    def reset(self) -> None:
        """Zero every cell (back to none allocated)."""
        self.__dict__.pop("packets", None)
        self.__dict__.pop("bytes", None)


@dataclass(frozen=True)
class MeterRate:
    """One token bucket's configuration in bmv2 units: units per microsecond and burst units."""

    info_rate: float
    burst_size: int


class Meter:
    """One meter cell, executing bmv2's Meter::execute token arithmetic exactly.

    bmv2 keeps the rates sorted from the highest colour down (PIR, then CIR); tokens are computed
    against one time origin, not from the last update, to avoid accumulating rounding.
    """

    __slots__ = ("_buckets", "colors", "rates", "tokens", "tokens_last")

    def __init__(self) -> None:
        self.rates: tuple[MeterRate, ...] = ()
        # Empty and shared until configured (set_rates gives each cell lists of its own): an array of
        # unconfigured cells costs one small object per cell.
        self.tokens: list[int] = _NO_TOKENS
        self.tokens_last: list[int] = _NO_TOKENS
        self.colors: tuple[int, ...] = ()
        # (index, info rate, burst size, colour) of each bucket, in `rates` order: what execute() reads.
        self._buckets: tuple[tuple[int, float, int, int], ...] = ()

    @property
    def configured(self) -> bool:
        """Whether rates were set; an unconfigured bmv2 meter marks every packet green."""
        return bool(self.rates)

    def set_rates(self, cir_first: list[MeterRate]) -> None:
        """Configure from rates ordered smallest first ({CIR, PIR}); buckets start full."""
        for lo, hi in zip(cir_first, cir_first[1:], strict=False):
            if lo.info_rate > hi.info_rate:
                raise ValueError("meter rates must be non-decreasing (CIR <= PIR)")
        # set_rate(idx) gives colour idx + 1, then bmv2 reverses the list.
        colors = [i + 1 for i in range(len(cir_first))]
        self.rates = tuple(reversed(cir_first))
        self.colors = tuple(reversed(colors))
        self.tokens = [r.burst_size for r in self.rates]
        self.tokens_last = [0 for _ in self.rates]
        self._buckets = tuple((i, r.info_rate, r.burst_size, self.colors[i]) for i, r in enumerate(self.rates))

    def reset(self) -> None:
        """Back to unconfigured."""
        self.rates = ()
        self.tokens = _NO_TOKENS
        self.tokens_last = _NO_TOKENS
        self.colors = ()
        self._buckets = ()

    def execute(self, units: int, now_us: int) -> int:
        """Colour of a packet of `units` bytes (or 1 packet) at time `now_us`."""
        buckets = self._buckets
        if not buckets:
            return GREEN
        tokens = self.tokens
        last = self.tokens_last
        for i, info_rate, burst_size, color in buckets:
            since_init = int(now_us * info_rate)
            new_tokens = since_init - last[i]
            last[i] = since_init
            t = tokens[i] + new_tokens
            if t > burst_size:
                t = burst_size
            if t < units:
                tokens[i] = t
                return color
            tokens[i] = t - units
        return GREEN


class MeterArray:
    """An indexed array of meters of one unit type (bytes or packets)."""

    def __init__(self, name: str, size: int, rate_count: int, unit: str) -> None:
        self.name = name
        self.size = size
        self.rate_count = rate_count
        self.unit = unit
        self.cells = [Meter() for _ in range(size)]

    def execute(self, index: int, length: int, now_us: int) -> int:
        """Execute the meter at `index` for a packet of `length` bytes."""
        if not 0 <= index < self.size:
            return GREEN
        return self.cells[index].execute(length if self.unit == "bytes" else 1, now_us)

    def set_p4runtime_config(self, index: int, cir: int, cburst: int, pir: int, pburst: int) -> None:
        """Configure a cell from P4Runtime units (units per second, bursts), as PI converts them."""
        configure_meter(self.cells[index], cir, cburst, pir, pburst)

    def get_p4runtime_config(self, index: int) -> tuple[int, int, int, int] | None:
        """The cell's (cir, cburst, pir, pburst) in P4Runtime units, or None when unconfigured."""
        return meter_config(self.cells[index])


def configure_meter(cell: Meter, cir: int, cburst: int, pir: int, pburst: int) -> None:
    """Configure a meter from P4Runtime units (units per second, bursts), as PI converts them for bmv2."""
    cell.set_rates(
        [
            MeterRate(cir / 1_000_000.0, cburst & PI_BURST_MASK),
            MeterRate(pir / 1_000_000.0, pburst & PI_BURST_MASK),
        ]
    )


def meter_config(cell: Meter) -> tuple[int, int, int, int] | None:
    """A meter's (cir, cburst, pir, pburst) in P4Runtime units, or None when unconfigured."""
    if not cell.configured:
        return None
    pir_rate, cir_rate = cell.rates[0], cell.rates[-1]
    return (
        round(cir_rate.info_rate * 1_000_000),
        _as_read_back(cir_rate.burst_size),
        round(pir_rate.info_rate * 1_000_000),
        _as_read_back(pir_rate.burst_size),
    )


def _as_read_back(burst: int) -> int:
    # simple_switch_grpc (PI) reads bursts back through a signed 32-bit value: 2**31 and above come
    # back negative (measured: 4294967295 reads back as -1). Match it.
    return burst - (1 << 32) if burst >= 1 << 31 else burst


class RegisterArray:
    """An indexed register array of fixed bit width (its cells allocated when first used, as CounterArray's)."""

    def __init__(self, name: str, size: int, bitwidth: int) -> None:
        self.name = name
        self.size = size
        self.mask = (1 << bitwidth) - 1

    @functools.cached_property
    def values(self) -> list[int]:
        """The value of each cell."""
        return [0] * self.size

    def read(self, index: int) -> int:
        """Value at `index` (0 out of range, like bmv2 after its error log)."""
        return self.values[index] if 0 <= index < self.size else 0

    def write(self, index: int, value: int) -> None:
        """Store `value` truncated to the register width."""
        if 0 <= index < self.size:
            self.values[index] = value & self.mask


class ValueSet:
    """A parser value set: the member values the control plane wrote, swapped in whole on each write."""

    def __init__(self, name: str, bitwidth: int, size: int) -> None:
        self.name = name
        self.bitwidth = bitwidth
        self.size = size
        self.values: frozenset[int] = frozenset()

    def matches(self, key: int, mask: int) -> bool:
        """Whether `key` (masked by the transition's mask, -1 for none) is a member."""
        if mask == -1:
            return key in self.values
        return any(key & mask == v & mask for v in self.values)
