"""TCP in virtual time: the model on plain simulated links, then against limiter.p4's policer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.frames import SPORT, tcp_frame
from dpu_lab.sim import NS, Engine, Link
from dpu_lab.tcp_model import MIN_RTO_NS, MSS, TcpReceiver, TcpSender, unwrap
from dpu_lab.virtual import VirtualLabRun
from dpu_softswitch.clock import VirtualClock
from helpers.paths import ROOT
from helpers.processes import cli

RATE = 100e6
DELAY_NS = 50_000
FRAME = MSS + 54


def _pair(drop: Callable[[Engine, Link], bool], dur_s: float) -> tuple[Engine, TcpSender, TcpReceiver]:
    """A sender and a receiver joined by two links at RATE; `drop` decides, per data frame, to lose it."""
    engine = Engine(VirtualClock())
    mac = bytes(6)
    data = tcp_frame("10.0.0.1", "10.0.0.2", SPORT, 5201, 1 << 22, MSS, mac, mac)
    ack = tcp_frame("10.0.0.2", "10.0.0.1", 5201, SPORT, 1 << 22, 0, mac, mac)
    senders: list[TcpSender] = []
    back = Link(engine, RATE, lambda f: senders[0].on_ack(f), delay_ns=DELAY_NS)
    rx = TcpReceiver(engine, back.send, ack, MSS)
    fwd = Link(engine, RATE, rx.on_data, delay_ns=DELAY_NS)

    def send(frame: bytes) -> None:
        if not drop(engine, fwd):
            fwd.send(frame)

    senders.append(TcpSender(engine, send, data, 0, int(dur_s * NS), (1 << 22) // MSS))
    senders[0].start()
    engine.run(int(dur_s * NS))
    return engine, senders[0], rx


def test_reaches_the_link_rate_without_loss() -> None:
    _, tx, rx = _pair(lambda e, link: False, 0.5)
    goodput = rx.goodput_bytes * 8 / 0.5
    assert 0.9 * RATE * MSS / FRAME <= goodput <= RATE * MSS / FRAME
    assert tx.retransmissions == tx.timeouts == tx.fast_retransmits == 0


def test_recovers_from_a_drop_tail_bottleneck() -> None:
    queue_ns = int(30_000 * 8 * NS / RATE)  # a 30 kB buffer

    def full(engine: Engine, link: Link) -> bool:
        return link.free_at - engine.now_ns > queue_ns

    _, tx, rx = _pair(full, 1.0)
    assert tx.fast_retransmits > 0 and tx.retransmissions > 0
    assert tx.timeouts == 0  # NewReno recovers a single-window loss without a timeout
    assert rx.goodput_bytes * 8 >= 0.85 * RATE * MSS / FRAME


def test_a_blackout_ends_in_a_timeout_and_the_flow_resumes() -> None:
    def blackout(engine: Engine, link: Link) -> bool:
        # Longer than the window's worth of queue on the link: the ACKs stop, the timer fires.
        return 100_000_000 <= engine.now_ns < 700_000_000

    _, tx, rx = _pair(blackout, 1.5)
    assert tx.timeouts >= 1 and tx.rto_ns >= MIN_RTO_NS
    # It resumed: far more got through than the 0.1 s before the outage could carry.
    assert rx.goodput_bytes * 8 >= 0.4 * 1.5 * RATE * MSS / FRAME
    assert not rx.held
    assert rx.rcv_nxt > 0 and not rx.held


def test_sequence_numbers_wrap() -> None:
    seg = 1460
    near = (1 << 32) // seg + 3  # beyond 4 GiB of data
    assert unwrap((near * seg) % (1 << 32), near - 5, seg) == near
    assert unwrap(((near - 2) * seg) % (1 << 32), near, seg) == near - 2


TCP_SCENARIO = """
name: vtcp
topology: {topo}
caps:
  - {{pod: a, egress: 8M, ingress: 8M, window_s: 1, burst_bytes: 1000000}}
  - {{pod: b, egress: 100M, ingress: 100M, window_s: 1}}
phases:
  - name: one
    duration_s: 3
    flows:
      - {{name: one, protocol: tcp, src: a1, dst: b1{extra}}}
  - name: two
    duration_s: 4
    flows:
      - {{name: two-a, protocol: tcp, src: a1, dst: b1}}
      - {{name: two-b, protocol: tcp, src: a1, dst: b1}}
"""


def _scenario(tmp_path: Path, extra: str = "") -> Path:
    """TCP_SCENARIO on disk, with `extra` fields in the first flow."""
    (p := tmp_path / "vtcp.yaml").write_text(
        TCP_SCENARIO.format(topo=ROOT / "bmv2-lab/topologies/two-pods.yaml", extra=extra)
    )
    return p


def test_tcp_under_a_cap_is_compliant_fair_and_deterministic(tmp_path: Path) -> None:
    runs = [VirtualLabRun(load_scenario(_scenario(tmp_path)), tmp_path / f"out{i}").run() for i in range(2)]
    r = runs[0]
    assert r.cap_held
    for res in r.results:
        assert res.max_window_bytes <= res.allowed_window_bytes
    flows = {f.name: f for f in r.flows}
    one = flows["one"]
    assert one.goodput_bps is not None and one.retransmissions is not None
    assert 0.6 * 8e6 <= one.goodput_bps <= one.delivered_bps <= 8e6 + 1_000_000 * 8 / 3
    assert one.retransmissions > 0  # the policer drops: TCP backs off and resends
    a, b = flows["two-a"].goodput_bps, flows["two-b"].goodput_bps
    assert a is not None and b is not None
    # Shared, if not evenly within seconds: the policer drops the tail of each window burst, so each
    # flow recovers by timeouts (no SACK or tail-loss probes), whose phases decide the shares.
    assert a + b >= 0.6 * 8e6 and min(a, b) >= 0.3 * (a + b)
    assert [f.__dict__ for f in runs[1].flows] == [f.__dict__ for f in r.flows]
    assert [x.max_window_bytes for x in runs[1].results] == [x.max_window_bytes for x in r.results]
    summary = (tmp_path / "out0" / "summary.md").read_text()
    assert "goodput (Mbit/s)" in summary and "retransmitted" in summary


def test_tcp_with_an_evasion_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'one'.*encap"):
        VirtualLabRun(load_scenario(_scenario(tmp_path, ", encap: gre")), tmp_path / "out").run()


def test_cli_runs_the_tcp_example_in_virtual_time(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    res = cli("lab", "run", str(ROOT / "bmv2-lab/scenarios/tcp-vs-cap.yaml"), "--out", str(out), "--time", "virtual")
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["time"] == "virtual"
    assert all(f["protocol"] == "tcp" and f["goodput_bps"] > 0 for f in report["flows"])
