"""The verifier's active probes (virtual time): a burst above the cap in every audit interval, judged
at its receiver. They find a compromised DPU whose pod's own traffic stays below the cap, with no
counter the operator's devices keep; a clean run raises no alert; a probe too short to tell is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, load_scenario, probe_allowance_bytes
from dpu_lab.virtual import VirtualLabRun
from dpu_verifier.api_view import ApiView
from dpu_verifier.checks import Probe
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


async def test_a_probe_burst_is_judged_whole_over_the_time_it_took(tmp_path: Path) -> None:
    """Real time, at the router: a burst's last datagrams drained after the tick that judged it count against
    that burst, not the next (counted with the next, they made two bursts' worth stand against one burst's
    allowance); and a burst that a loaded target passed over more time than it was sent in is allowed the
    cap's rate over that time (a clean run's alarm, 2026-12-03: 2,511,964 B against 2,507,590)."""
    from dpu_lab.live_audit import PROBE_SLACK_BYTES, LiveAudit
    from dpu_verifier.checks import Auditor

    sc = load_scenario(scenario(tmp_path, ["probe"], None))
    assert sc.audit is not None
    cap = sc.caps[0]
    rate = sc.peak_rates(cap.pod)[0]
    live = LiveAudit(sc, "127.0.0.1:1", "ns", dict, t_start=1000.0)
    port, first, wire = 60000, 1001.0, 1000

    def allowance(span: float) -> int:
        return probe_allowance_bytes(cap, rate, span) + PROBE_SLACK_BYTES

    nominal = allowance(sc.audit.probe_s)
    probe = live._probes[port] = Probe("a", offered_bytes=2 * nominal, allowance_bytes=nominal)
    live._probe_caps[port] = (cap, rate)
    live._probe_first = first
    auditor = Auditor([], {}, ApiView("127.0.0.1:1"), checks=["probe"], probes=[probe])

    def arrive(burst: int, share: float, over_s: float = 0.45) -> None:
        """`share` of the nominal allowance, sent in `burst` and arriving over its first `over_s` seconds."""
        n = int(share * nominal / wire)
        start = first + burst
        live._probe_pending += [(start + i * 0.4 / n, port, wire, start + 0.01 + i * over_s / n) for i in range(n)]

    arrive(0, 0.6)
    live._judge_probes(first + 1)
    await auditor.tick(2.0)
    arrive(0, 0.35)  # more of burst 0, drained only after the tick that judged it
    arrive(1, 0.95)
    live._judge_probes(first + 2)
    await auditor.tick(3.0)
    assert auditor.alerts == []  # 1.3 x the allowance in one tick before
    arrive(2, 1.1, over_s=0.8)  # passed over 0.8 s by a slow target: the cap allows that much
    live._judge_probes(first + 3)
    await auditor.tick(4.0)
    assert auditor.alerts == [] and nominal < probe.allowances[2] <= allowance(0.8)
    assert nominal < probe.bursts[2] <= probe.allowances[2]
    arrive(1, 0.1)  # burst 1 now over its allowance, late or not
    live._judge_probes(first + 4)
    await auditor.tick(5.0)
    assert probe.bursts[3] == 0  # burst 3 lost entirely: judged at nothing
    assert [a.check for a in auditor.alerts] == ["probe"] and f"{probe.bursts[1]} got through" in auditor.alerts[
        0
    ].detail


async def test_a_probe_burst_cannot_buy_time_or_be_forged_away(tmp_path: Path) -> None:
    """Red team, 2026-12-03: a DPU that passes a burst at line rate and holds one datagram back gains no
    longer allowance (its arrival curve is judged); stamps that cannot be true (not finite, after their
    arrival, in an old burst) are dropped, and stop nothing."""
    from dpu_lab.live_audit import PROBE_SLACK_BYTES, LiveAudit
    from dpu_verifier.checks import Auditor

    sc = load_scenario(scenario(tmp_path, ["probe"], None))
    assert sc.audit is not None
    cap = sc.caps[0]
    rate = sc.peak_rates(cap.pod)[0]
    nominal = probe_allowance_bytes(cap, rate, sc.audit.probe_s) + PROBE_SLACK_BYTES
    live = LiveAudit(sc, "127.0.0.1:1", "ns", dict, t_start=1000.0)
    port, first = 60000, 1001.0
    probe = live._probes[port] = Probe("a", offered_bytes=2 * nominal, allowance_bytes=nominal)
    live._probe_caps[port] = (cap, rate)
    live._probe_first = first
    auditor = Auditor([], {}, ApiView("127.0.0.1:1"), checks=["probe"], probes=[probe])
    n = int(1.6 * nominal / 1442)
    # Burst 0 at line rate within 0.45 s, its last datagram held back to 0.9 s.
    live._probe_pending += [(first + i * 0.4 / n, port, 1442, first + 0.01 + i * 0.44 / n) for i in range(n)]
    live._probe_pending.append((first + 0.4, port, 1442, first + 0.9))
    # Forged stamps: not finite, after the arrival (a seed for a later burst), and far in the past.
    live._probe_pending += [
        (float("nan"), port, 1442, first + 0.1),
        (float("-inf"), port, 1442, first + 0.1),
        (first + 3.0, port, 100, first + 0.05),
        (first - 50.0, port, 1442, first + 0.2),
    ]
    live._judge_probes(first + 1)
    await auditor.tick(2.0)
    assert [a.check for a in auditor.alerts] == ["probe"], probe.allowances
    assert probe.bursts == {0: (n + 1) * 1442} and live._probe_pending == []
