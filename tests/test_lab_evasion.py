"""Evasion traffic in virtual time: every shape is metered against the sending pod's cap, a forged
source is dropped at the sender's DPU, and the cap holds at the receivers in both placements."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from dpu_lab.config import load_scenario
from dpu_lab.virtual import VirtualLabRun

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
