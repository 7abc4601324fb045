"""Evasion traffic: every shape is metered against the sending pod's cap, a forged source is dropped at
the sender's DPU, and the cap holds at the receivers, in virtual time (both placements) and in real time
(raw frames through namespaces, on the embedded target and on bmv2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, Scenario, load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.virtual import VirtualLabRun
from helpers.netns import can_netns
from helpers.paths import ROOT

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
def test_no_evasion_gets_past_the_cap(tmp_path: Path, placement: str) -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "evasion.yaml")
    pods = [p.model_copy(update={"placement": placement}) for p in sc.topology.pods]
    sc = sc.model_copy(update={"topology": sc.topology.model_copy(update={"pods": pods})})
    r = VirtualLabRun(sc, tmp_path / "out").run()
    assert r.cap_held, [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    flows = {f.name: f for f in r.flows}
    # Every shape got some of the cap (it was metered, not blocked or exempted) ...
    for name in ("plain", "vlan", "ipv6", "gre", "vxlan", "fragments"):
        assert 0 < flows[name].delivered_bps < 4e6, name
    # ... and together no more than the cap (plus the bucket over the 6 s phase).
    shapes = sum(flows[n].delivered_bps for n in ("plain", "vlan", "ipv6", "gre", "vxlan", "fragments"))
    assert shapes <= 8e6 + 100_000 * 8 / 6 + 1
    # A source forged into pod b never leaves pod a: dropped, and counted, as spoofed.
    assert flows["spoofed-into-b"].delivered_bps == 0
    egress = next(u for u in r.dpu_counters if (u["pod"], u["direction"]) == ("a", "egress"))
    assert int(egress.get("spoofed_bytes", 0)) > 0


SHAPES = ("plain", "vlan", "ipv6", "gre", "vxlan", "fragments")


def real_time_scenario() -> Scenario:
    """evasion.yaml for real time: its shapes for 4 s, then its load split over three hosts for 3 s (its
    bursts are a workload, virtual time only), with buckets of 400 kB (bmv2 queues 294 kB after its meter)."""
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "evasion.yaml")
    shapes, split = sc.phases
    phases = [shapes.model_copy(update={"duration_s": 4}), split.model_copy(update={"duration_s": 3, "workloads": []})]
    caps = [c.model_copy(update={"burst_bytes": 400_000}) for c in sc.caps]
    return sc.model_copy(update={"phases": phases, "caps": caps})


@pytest.mark.netns
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_no_evasion_gets_past_the_cap_in_real_time(tmp_path: Path, target: str) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    r = LabRun(real_time_scenario(), tmp_path / "out", target, "builtin").run()  # type: ignore[arg-type]
    # Zero bytes above the cap at the receivers, in every window of every pod and direction.
    assert r.cap_held, [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    flows = {f.name: f for f in r.flows}
    # Raw frames of every shape reached their receivers through both pods' DPUs (each was metered, not blocked
    # or dropped as unknown) ...
    for name in SHAPES:
        assert flows[name].delivered_bps > 0, name
    # ... and together no more than the cap guarantees over the time they arrived in, plus the bucket and one
    # frame: what the meter promises, whatever share of it each shape gets (that share moves with machine load).
    # On a busy machine senders may start late and end late: the phase's 4 s is not that time.
    got = [json.loads((tmp_path / "out" / "raw" / f"{n}-recv.json").read_text()) for n in SHAPES]
    span = max(g["last_arrival"] for g in got) - min(g["first_arrival"] for g in got)
    assert sum(g["received_wire_bytes"] for g in got) <= 8e6 * span / 8 + 400_000 + 1518
    # A source forged into pod b never leaves pod a: dropped, and counted, as spoofed.
    assert flows["spoofed-into-b"].delivered_bps == 0
    egress = next(u for u in r.dpu_counters if (u["pod"], u["direction"]) == ("a", "egress"))
    assert 0 < int(egress["spoofed_bytes"]) <= round(flows["spoofed-into-b"].offered_bps * 4 / 8)
    # The report names each flow's shape.
    assert (flows["vxlan"].shape, flows["spoofed-into-b"].shape, flows["plain"].shape) == (
        "vxlan",
        "spoof_src 10.0.2.7",
        "",
    )
    assert "| udp (vxlan) |" in (tmp_path / "out" / "summary.md").read_text()
    # The receiver counts a VLAN frame whole although the kernel took its tag out before the socket saw it.
    vlan = json.loads((tmp_path / "out" / "raw" / "vlan-recv.json").read_text())
    assert vlan["received_wire_bytes"] == vlan["received_packets"] * (1400 + 8 + 20 + 4 + 14)


def test_a_frame_too_long_for_the_mtu_is_refused_in_real_time(tmp_path: Path) -> None:
    sc = real_time_scenario()
    flows = [f.model_copy(update={"size": 1472}) if f.name == "vxlan" else f for f in sc.phases[0].flows]
    sc = sc.model_copy(update={"phases": [sc.phases[0].model_copy(update={"flows": flows})]})
    with pytest.raises(ConfigError, match=r"phases\[0\]\.flows\[4\]\.size: 1472 bytes shaped as vxlan .* at most 1422"):
        LabRun(sc, tmp_path / "out").run()
