"""The one place where bit/s become data-plane units."""

import math

import pytest

from dpu_limiter.units import (
    MAX_PI_BURST,
    UnitError,
    allowed_window_bytes,
    bps_to_bytes_per_s,
    bytes_per_s_to_bmv2_rate,
    cap_meter,
    check_burst,
    default_burst_bytes,
    format_rate,
    parse_rate,
)


def test_bits_to_bytes_per_second() -> None:
    assert bps_to_bytes_per_s(1e9) == 125_000_000  # Lucid's 1 Gbit/s = 125 MB/s
    assert bps_to_bytes_per_s(20e6) == 2_500_000
    assert bps_to_bytes_per_s(12) == 2  # 1.5 B/s rounds to nearest even


def test_bmv2_rate_is_bytes_per_microsecond() -> None:
    # PI divides P4Runtime's bytes/s by 1e6: bmv2 meters count per microsecond.
    assert bytes_per_s_to_bmv2_rate(125_000_000) == 125.0
    assert bytes_per_s_to_bmv2_rate(2_500_000) == 2.5


def test_cap_meter_drops_only_above_cap() -> None:
    m = cap_meter(20e6, 2_500_000)
    assert (m.cir, m.pir, m.cburst, m.pburst) == (2_500_000, 2_500_000, 2_500_000, 2_500_000)


def test_bursts_beyond_32_bits_are_refused_not_wrapped() -> None:
    assert check_burst(MAX_PI_BURST) == MAX_PI_BURST
    with pytest.raises(UnitError, match="burst_bytes"):
        check_burst(MAX_PI_BURST + 1)
    # 1 Gbit/s over 60 s is 7.5 GB: a meter burst cannot hold it (the window mode must).
    with pytest.raises(UnitError, match="7500000000"):
        cap_meter(1e9, 7_500_000_000)


def test_rates_must_be_finite_and_non_negative() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(UnitError, match="cap.egress_bps"):
            bps_to_bytes_per_s(bad, "cap.egress_bps")


def test_default_burst() -> None:
    assert default_burst_bytes(1e6) == 16 * 1024
    assert default_burst_bytes(1e9) == 12_500_000


def test_allowed_window_bytes() -> None:
    assert allowed_window_bytes(20e6, 10, 2_500_000) == 25_000_000 + 2_500_000 + 1518
    assert allowed_window_bytes(1e9, 60, 0) == 7_500_000_000 + 1518


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20M", 20e6),
        ("1G", 1e9),
        ("1.5g", 1.5e9),
        ("500k", 5e5),
        ("1000", 1e3),
        ("20Mbit/s", 20e6),
        (7, 7.0),
        ("10 Mbps", 10e6),
    ],
)
def test_parse_rate(text: str | int, value: float) -> None:
    assert parse_rate(text) == value


@pytest.mark.parametrize("text", ["", "fast", "-5M", "0", "1X", "inf"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(UnitError, match="--egress"):
        parse_rate(text, "--egress")


@pytest.mark.parametrize(
    ("rate", "text"), [(1e9, "1G"), (2.5e6, "2.5M"), (500.0, "500"), (1.6e12, "1.6T"), (8e3, "8k")]
)
def test_format_rate_reads_back(rate: float, text: str) -> None:
    assert format_rate(rate) == text and parse_rate(text) == rate
