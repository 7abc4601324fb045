"""The embedded target's meters follow bmv2's Meter::execute token arithmetic exactly."""

from dpu_softswitch.externs import GREEN, PI_BURST_MASK, RED, YELLOW, Meter, MeterArray, MeterRate


def two_rate(cir: int, cburst: int, pir: int, pburst: int) -> Meter:
    arr = MeterArray("m", 1, 2, "bytes")
    arr.set_p4runtime_config(0, cir, cburst, pir, pburst)
    return arr.cells[0]


def test_unconfigured_meter_is_green_like_bmv2() -> None:
    # bmv2 returns colour 0 from a meter with no rates: why the control plane sets meters first.
    assert Meter().execute(10_000, 5) == GREEN


def test_single_rate_policer() -> None:
    m = two_rate(1000, 1500, 1000, 1500)  # 1000 B/s = 0.001 B/us, buckets start full
    assert m.execute(1000, 1_000_000) == GREEN
    assert m.execute(1000, 1_000_000) == RED  # 500 tokens left: red, nothing taken
    assert m.execute(500, 1_000_000) == GREEN
    assert m.execute(500, 1_499_999) == RED  # 499 tokens refilled
    assert m.execute(500, 1_500_000) == GREEN


def test_two_rate_three_colour_order_peak_first() -> None:
    m = two_rate(1000, 1000, 2000, 2000)
    # Peak bucket (2000) has room, committed (1000) does not: yellow, and only the peak bucket pays.
    assert m.execute(1500, 10) == YELLOW
    assert m.tokens == [500, 1000]  # [peak, committed]: bmv2 stores the rates reversed
    assert m.execute(600, 10) == RED
    assert m.execute(500, 10) == GREEN
    assert m.tokens == [0, 500]


def test_tokens_are_counted_from_the_time_origin_and_truncated() -> None:
    m = Meter()
    m.set_rates([MeterRate(0.0015, 10), MeterRate(0.0015, 10)])
    m.tokens = [0, 0]
    # int(1001 * 0.0015) = 1 token, not 1.5; the fraction is not lost, as tokens_last is absolute.
    assert m.execute(1, 1001) == GREEN
    assert m.execute(1, 1001) == RED
    assert m.execute(1, 2001) == GREEN  # int(3.0015) - 1 = 2 new tokens
    assert m.execute(1, 2001) == GREEN


def test_pi_narrows_bursts_to_32_bits() -> None:
    arr = MeterArray("m", 1, 2, "bytes")
    arr.set_p4runtime_config(0, 1, (1 << 32) + 5, 1, (1 << 32) + 5)
    assert arr.cells[0].rates[0].burst_size == 5 == ((1 << 32) + 5) & PI_BURST_MASK


def test_config_reads_back_in_p4runtime_units() -> None:
    arr = MeterArray("m", 2, 2, "bytes")
    arr.set_p4runtime_config(1, 2_500_000, 3000, 5_000_000, 6000)
    assert arr.get_p4runtime_config(1) == (2_500_000, 3000, 5_000_000, 6000)
    assert arr.get_p4runtime_config(0) is None


def test_packet_meter_counts_packets() -> None:
    arr = MeterArray("m", 1, 2, "packets")
    arr.set_p4runtime_config(0, 1, 2, 1, 2)
    assert [arr.execute(0, 1500, 0) for _ in range(3)] == [GREEN, GREEN, RED]
