"""Pure measurement functions over binned byte series ``(t0, bin_s, bins)``.

A series holds the bytes that arrived in consecutive bins of ``bin_s`` seconds, bin ``i``
covering ``[t0 + i*bin_s, t0 + (i+1)*bin_s)``.

Compliance (docs/design.md, cap semantics) needs the most bytes in any window of length W,
with window start times sliding in steps of at most W/60. ``max_window_bytes`` slides by one
bin, so with the capture's 1 ms bins the start times are no coarser than window/100 for every
window >= 0.1 s (and W/60 for windows >= 60 ms). Because a window covers whole bins, a
packet is counted in the window that holds its bin; the residual error is at most one bin's
bytes at each window edge.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from dpu_verifier import checks

Series = tuple[float, float, Sequence[int]]


def _check_bin(bin_s: float) -> None:
    """Raise ValueError unless ``bin_s`` is a positive bin width."""
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s!r}")


def max_window_bytes(t0: float, bin_s: float, bins: Sequence[int], window_s: float) -> int:
    """Return the most bytes in any window of ``window_s`` whose start is on the bin grid (the verifier's
    rule, dpu_verifier.checks.max_window_bytes). ``t0`` does not change the result; it is taken so every
    function has the same series signature."""
    return checks.max_window_bytes(bin_s, bins, window_s)


def merge_series(series: list[Series]) -> tuple[float, float, npt.NDArray[np.int64]]:
    """Sum several series with the same ``bin_s`` on one grid starting at the earliest t0.

    Empty series do not move the start of the grid. Start times are snapped to the nearest
    bin, which is exact for series binned on the absolute grid ``k * bin_s`` (as the
    receivers and the capture do).
    """
    if not series:
        raise ValueError("series must not be empty")
    bin_s = series[0][1]
    _check_bin(bin_s)
    for _, other_bin_s, _ in series:
        if not np.isclose(other_bin_s, bin_s, rtol=1e-9, atol=0.0):
            raise ValueError(f"all series must have bin_s {bin_s!r}, got {other_bin_s!r}")
    filled = [(t0, np.asarray(bins, dtype=np.int64)) for t0, _, bins in series if len(bins)]
    if not filled:
        return min(t0 for t0, _, _ in series), bin_s, np.zeros(0, dtype=np.int64)
    start = min(t0 for t0, _ in filled)
    offsets = [round((t0 - start) / bin_s) for t0, _ in filled]
    total = np.zeros(max(off + values.size for off, (_, values) in zip(offsets, filled, strict=True)), dtype=np.int64)
    for off, (_, values) in zip(offsets, filled, strict=True):
        total[off : off + values.size] += values
    return start, bin_s, total


def delivered_bps(total_bytes: int, duration_s: float) -> float:
    """Return the average rate in bit/s of ``total_bytes`` over ``duration_s`` seconds."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    return total_bytes * 8 / duration_s


def throughput_series(
    t0: float, bin_s: float, bins: Sequence[int], step_s: float = 0.5
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Resample a series to steps of ``step_s``; return step start times and bit/s per step.

    A step covers ``round(step_s / bin_s)`` bins (at least one); a shorter last step is
    averaged over its own length.
    """
    _check_bin(bin_s)
    if not step_s > 0:
        raise ValueError(f"step_s must be > 0, got {step_s!r}")
    per_step = max(1, round(step_s / bin_s))
    values = np.asarray(bins, dtype=np.int64)
    starts = np.arange(0, values.size, per_step)
    sums = np.add.reduceat(values, starts) if values.size else np.zeros(0, dtype=np.int64)
    lengths = np.minimum(per_step, values.size - starts) * bin_s
    times = (t0 + starts * bin_s).astype(np.float64)
    return times, (sums * 8 / lengths).astype(np.float64)
