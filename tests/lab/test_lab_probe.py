"""The verifier's active probes (virtual time): a burst above the cap in every audit interval, judged
at its receiver. They find a compromised DPU whose pod's own traffic stays below the cap, with no
counter the operator's devices keep; a clean run raises no alert; a probe too short to tell is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.virtual import VirtualLabRun
from dpu_verifier.checks import ApiView, Probe
from helpers.scenarios import probed_scenario as scenario

pytestmark = pytest.mark.timeout(300)
SEGMENT = 8000
COMPROMISE = {"at_s": 2.5, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}


def test_a_clean_run_with_probes_raises_no_alert(tmp_path: Path) -> None:
    r = VirtualLabRun(load_scenario(scenario(tmp_path, ["probe"], None)), tmp_path / "out", segment_bytes=SEGMENT).run()
    assert r.cap_held  # the probes' own bytes count against the cap, and the cap holds them
    assert r.audit is not None and r.audit["alerts"] == []


def test_probes_find_a_compromise_the_pods_traffic_does_not_show(tmp_path: Path) -> None:
    # Router counting alone: the pod's 4 Mbit/s never exceeds the cap, so nothing is seen.
    r = VirtualLabRun(
        load_scenario(scenario(tmp_path, ["router-count"], COMPROMISE)), tmp_path / "rc", segment_bytes=SEGMENT
    ).run()
    assert r.audit is not None and not r.audit["detected"]
    # The probe: the next burst after the compromise passes whole, and its receiver says so.
    r = VirtualLabRun(
        load_scenario(scenario(tmp_path, ["probe"], COMPROMISE)), tmp_path / "pr", segment_bytes=SEGMENT
    ).run()
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert r.audit["detected_by"] == ["probe"]
    # The first burst after the compromise (at 2.6 s) runs 3.0-3.5 s, judged at the 4.0 s tick.
    assert r.audit["time_to_detection_s"] <= 2.0
    assert r.audit["alerts"][0]["where"] == "a egress"


def test_a_probe_too_short_to_exceed_the_allowance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"audit.probe_s: 0.05 s at 2x pod a's cap .* needs more than 0.1"):
        load_scenario(scenario(tmp_path, ["probe"], None, probe_s=0.05))
    with pytest.raises(ConfigError, match="probe_s: 1.5 must be shorter than interval_s"):
        load_scenario(scenario(tmp_path, ["probe"], None, probe_s=1.5))


async def test_a_straggler_counts_against_its_own_burst_not_the_next(tmp_path: Path) -> None:
    """Real time: a burst's last datagrams reach the router after the tick that judged it (a slow target, a
    loaded machine). Counted with the next burst they made a clean run alarm once; counted against their
    own burst, a clean run stays quiet and a burst that is over its allowance, late bytes included, is not."""
    from dpu_lab.live_audit import LiveAudit
    from dpu_verifier.checks import Auditor

    sc = load_scenario(scenario(tmp_path, ["probe"], None))
    live = LiveAudit(sc, "127.0.0.1:1", "ns", dict, t_start=1000.0)
    probe = live._probes[60000] = Probe("a", offered_bytes=500_000, allowance_bytes=300_000)
    live._probe_first = 1001.0
    auditor = Auditor([], {}, ApiView("127.0.0.1:1"), checks=["probe"], probes=[probe])

    def datagrams(burst: int, n: int, late: bool = False) -> None:
        start = 1001.0 + burst + (0.4 if late else 0.0)  # late: the end of the burst's half second
        live._probe_pending += [(start + i * 1e-4, 60000, 1000) for i in range(n)]

    datagrams(0, 200)  # 200,000 B of burst 0 reached the router before the tick at 1002
    live._judge_probes(1002.0)
    await auditor.tick(2.0)
    datagrams(0, 90, late=True)  # 90,000 B more of burst 0 arrive only now
    datagrams(1, 290)  # and all of burst 1: 290,000 B
    live._judge_probes(1003.0)
    await auditor.tick(3.0)
    assert probe.bursts == {0: 290_000, 1: 290_000} and auditor.alerts == []  # 580,000 B in one tick before
    datagrams(1, 20, late=True)  # burst 1 now has 310,000 B: over its allowance, late or not
    live._judge_probes(1004.0)
    await auditor.tick(4.0)
    assert probe.bursts[2] == 0  # burst 2 lost entirely: judged at nothing
    assert [a.check for a in auditor.alerts] == ["probe"] and "310000 got through" in auditor.alerts[0].detail
