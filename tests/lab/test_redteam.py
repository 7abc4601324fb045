"""The red team's corpus (frames.py REDTEAM; bmv2-lab/scenarios/redteam.yaml): every frame shape an attacker
with limiter.p4 in hand would try against its exemptions, sent by pod a's host at twice a's cap and at the
sender's full speed, with pod-uplink and with node placement, in real time on the embedded target and on
bmv2, and in virtual time. Whatever the frames hold, in every window of every pod and direction no more
crosses than the cap allows (rate x window + bucket + one frame): the guarantee, not a share of the load.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from dpu_lab.config import FULL_SPEED, ConfigError, FlowSpec, Scenario, load_scenario
from dpu_lab.frames import FIXED_LENGTH, REDTEAM, largest_payload
from dpu_lab.report import Report
from dpu_lab.runner import LabRun
from dpu_lab.virtual import VirtualLabRun
from helpers.netns import can_netns
from helpers.paths import ROOT

SCENARIO = ROOT / "bmv2-lab" / "scenarios" / "redteam.yaml"
CAP_BPS = 8e6  # pod a's cap, both directions (redteam.yaml)
# Real time: each family for 2 s as fast as its senders write. Virtual time has no such speed (its host links
# run at 100 Gbit/s, far more frames than a simulation should carry): 8 x the cap for 0.5 s stands in for it.
FULL_S = {"real": 2.0, "virtual": 0.5}
VIRTUAL_FULL_BPS = 8 * CAP_BPS


def redteam_scenario(
    placement: str, full_rate: float | str, full_s: float, mode: str = "rate", families: tuple[str, ...] = ()
) -> Scenario:
    """redteam.yaml with `placement` for every pod and pod a's cap in `mode`, its `families` (phases; all by
    default), each again at `full_rate` (FULL_SPEED: as fast as the sender writes) for `full_s` (if not 0)."""
    doc: dict[str, Any] = load_scenario(SCENARIO).model_dump(mode="json")
    for pod in doc["topology"]["pods"]:
        pod["placement"] = placement
    doc["caps"][0]["mode"] = mode
    doc["phases"] = [ph for ph in doc["phases"] if not families or ph["name"] in families]
    full = [
        {
            "name": f"{ph['name']}-full",
            "duration_s": full_s,
            "flows": [{**f, "name": f"{f['name']}-full", "rate": full_rate} for f in ph["flows"]],
        }
        for ph in doc["phases"]
        if full_s
    ]
    doc["phases"] += full
    return Scenario.model_validate(doc)


def assert_held(r: Report) -> None:
    """Every pod and direction, its largest window on the wire within its allowance (which has the one frame a
    window's edge may cut in it: units.allowed_window_bytes)."""
    seen = [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    assert {(pod, d) for pod, d, _, _ in seen} == {(p, d) for p in ("a", "b") for d in ("egress", "ingress")}
    assert r.cap_held, seen
    assert all(most <= allowed for _, _, most, allowed in seen), seen


def assert_attacked(r: Report, sc: Scenario) -> None:
    """The attack was real: in every phase pod a's senders offered more than one window's allowance (else a held
    cap would prove nothing)."""
    allowance = next(x.allowed_window_bytes for x in r.results if (x.pod, x.direction) == ("a", "egress"))
    offered = {f.name: f.offered_bps for f in r.flows}
    for ph in sc.phases:
        sent = sum(offered[f.name] for f in ph.flows) * ph.duration_s / 8
        assert sent > allowance, (ph.name, sent)


def test_the_corpus_has_every_red_team_shape() -> None:
    sc = load_scenario(SCENARIO)
    assert {f.encap for ph in sc.phases for f in ph.flows} == set(REDTEAM)
    # Every shape that grows with its payload at its largest size: the most bytes per frame the lab's MTU lets
    # through (1518 with an 802.1Q tag, 1514 otherwise).
    sized = [f for ph in sc.phases for f in ph.flows if f.encap not in FIXED_LENGTH]
    assert [f.size for f in sized] == [largest_payload(f.encap) for f in sized]


def test_full_speed_is_for_raw_frames_and_a_claim_needs_an_unused_address() -> None:
    flow = {"name": "f", "protocol": "udp", "src": "a1", "dst": "b1", "rate": FULL_SPEED}
    assert FlowSpec.model_validate({**flow, "encap": "arp-big"}).rate == math.inf
    assert FlowSpec.model_validate({**flow, "spoof_src": "10.0.2.7"}).rate == math.inf
    with pytest.raises(ValueError, match="rate: max is for raw-frame flows"):
        FlowSpec.model_validate(flow)  # a socket sender paces; it has no full speed
    doc: dict[str, Any] = load_scenario(SCENARIO).model_dump(mode="json")
    doc["topology"]["pods"][0]["subnet"] = "10.0.1.64/29"  # .77 is not in it
    with pytest.raises(ValueError, match=r"intra-claim claims 10\.0\.1\.77, which is not an unused address of pod"):
        Scenario.model_validate(doc)


@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
def test_no_red_team_shape_gets_past_the_cap_in_virtual_time(tmp_path: Path, placement: str) -> None:
    sc = redteam_scenario(placement, VIRTUAL_FULL_BPS, FULL_S["virtual"])
    r = VirtualLabRun(sc, tmp_path / "out").run()
    assert_attacked(r, sc)
    assert_held(r)


@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
def test_arp_floods_stay_within_a_window_budget(tmp_path: Path, placement: str) -> None:
    # In window mode the allowance is the budget itself (and one frame), no bucket: the ARP meters' carve-out
    # must come out of the budget too, or a flood of minimum-size ARP beside metered traffic that fills the
    # budget exceeds it. Its 3 s at twice the cap span a whole window (what a carve-out left out would add up
    # over); a faster flood adds nothing, the ARP meters bound it.
    sc = redteam_scenario(placement, VIRTUAL_FULL_BPS, 0, mode="window", families=("arp",))
    r = VirtualLabRun(sc, tmp_path / "out").run()
    assert_attacked(r, sc)
    assert_held(r)


@pytest.mark.netns
@pytest.mark.timeout(300)
@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_no_red_team_shape_gets_past_the_cap_in_real_time(tmp_path: Path, target: str, placement: str) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    # The full-speed phases are bounded by their duration: the senders stop when it is over (evasion.flood).
    sc = redteam_scenario(placement, FULL_SPEED, FULL_S["real"])
    if (target, placement) == ("bmv2", "node"):
        # Two node DPUs split a's bucket; each needs room for bmv2's 294 kB of queues after its meter.
        caps = [sc.caps[0].model_copy(update={"burst_bytes": 800_000}), *sc.caps[1:]]
        sc = sc.model_copy(update={"caps": caps})
    r = LabRun(sc, tmp_path / "out", target, "builtin").run()  # type: ignore[arg-type]
    assert_attacked(r, sc)
    assert_held(r)


def test_a_red_team_frame_too_long_for_the_mtu_is_refused_in_real_time(tmp_path: Path) -> None:
    sc = redteam_scenario("pod-uplink", FULL_SPEED, FULL_S["real"])
    flows = [f.model_copy(update={"size": 1472}) if f.encap == "qinq" else f for f in sc.phases[1].flows]
    sc = sc.model_copy(update={"phases": [sc.phases[1].model_copy(update={"flows": flows})]})
    with pytest.raises(ConfigError, match=r"phases\[0\]\.flows\[3\]\.size: 1472 bytes shaped as qinq .* at most 1464"):
        LabRun(sc, tmp_path / "out").run()
