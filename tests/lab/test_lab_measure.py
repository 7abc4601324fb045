"""Tests for dpu_lab.measure on hand-made series."""

from __future__ import annotations

import numpy as np
import pytest

from dpu_lab.measure import delivered_bps, max_window_bytes, merge_series, throughput_series


def test_constant_rate_window_holds_rate_times_window() -> None:
    bins = [1000] * 500  # 1 MB/s in 1 ms bins for 0.5 s
    assert max_window_bytes(0.0, 0.001, bins, 0.1) == 100_000


def test_burst_inside_one_window_is_found() -> None:
    bins = [100] * 1000
    bins[400:410] = [50_000] * 10
    # The best 100-bin window holds the whole burst plus 90 ordinary bins.
    assert max_window_bytes(0.0, 0.001, bins, 0.1) == 500_000 + 90 * 100


def test_burst_straddling_grid_positions_is_not_split() -> None:
    bins = [0] * 300
    bins[149] = bins[150] = 7
    assert max_window_bytes(0.0, 0.001, bins, 0.002) == 14


def test_window_longer_than_series_is_total() -> None:
    assert max_window_bytes(5.0, 0.001, [3, 4, 5], 60.0) == 12
    assert max_window_bytes(5.0, 0.001, [], 1.0) == 0


def test_window_exceeding_32_bits_is_exact() -> None:
    bins = [125_000_000] * 70  # 1 Gbit/s in 1 s bins
    assert max_window_bytes(0.0, 1.0, bins, 60.0) == 7_500_000_000


def test_misaligned_window_covers_rounded_bin_count() -> None:
    bins = [1, 2, 3, 4, 5, 6]
    assert max_window_bytes(0.0, 1.0, bins, 2.4) == 11  # 2 bins
    assert max_window_bytes(0.0, 1.0, bins, 2.6) == 15  # 3 bins


@pytest.mark.parametrize(
    ("bin_s", "window_s", "argument"),
    [(0.01, 0.005, "window_s"), (0.0, 1.0, "bin_s"), (-1.0, 1.0, "bin_s")],
)
def test_invalid_window_or_bin_raises_naming_argument(bin_s: float, window_s: float, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        max_window_bytes(0.0, bin_s, [1, 2, 3], window_s)


def test_merge_series_aligns_on_earliest_start() -> None:
    t0, bin_s, merged = merge_series([(10.02, 0.01, [1, 1, 1]), (10.00, 0.01, [5, 5]), (10.05, 0.01, [7])])
    assert t0 == pytest.approx(10.0)
    assert bin_s == 0.01
    assert merged.tolist() == [5, 5, 1, 1, 1, 7]


def test_merge_series_ignores_empty_series_for_start() -> None:
    t0, _, merged = merge_series([(0.0, 0.01, []), (3.0, 0.01, [2, 2])])
    assert t0 == 3.0
    assert merged.tolist() == [2, 2]


def test_merge_series_rejects_mixed_bins_and_empty_input() -> None:
    with pytest.raises(ValueError, match="bin_s"):
        merge_series([(0.0, 0.01, [1]), (0.0, 0.001, [1])])
    with pytest.raises(ValueError, match="series"):
        merge_series([])


def test_delivered_bps() -> None:
    assert delivered_bps(1_250_000, 2.0) == 5_000_000.0
    with pytest.raises(ValueError, match="duration_s"):
        delivered_bps(1, 0.0)


def test_throughput_series_resamples_with_partial_last_step() -> None:
    times, bps = throughput_series(100.0, 0.01, [1000] * 120, step_s=0.5)
    np.testing.assert_allclose(times, [100.0, 100.5, 101.0])
    np.testing.assert_allclose(bps, [800_000.0] * 3)
