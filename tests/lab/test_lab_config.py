"""Scenario and topology files: the shipped ones load; bad ones are refused naming field and value."""

from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "bmv2-lab" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.phases and sc.topology.pods


def test_two_pods_scenario_matches_the_issue() -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "two-pods.yaml")
    assert [p.name for p in sc.topology.pods] == ["a", "b"]
    assert all(c.egress == c.ingress == 20e6 for c in sc.caps)
    flows = {f.name: f for ph in sc.phases for f in ph.flows}
    assert flows["udp-a-to-b"].rate == 40e6
    assert flows["tcp-b-to-a"].protocol == "tcp"
    assert flows["udp-a-to-b-below-cap"].rate == 10e6
    assert sc.topology.address_of("a1") == "10.0.1.1"
    assert sc.topology.pod("a").gateway == "10.0.1.254"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


BASE = """
name: t
topology:
  name: t
  pods:
    - {name: a, subnet: 10.0.1.0/24, hosts: [a1]}
    - {name: b, subnet: 10.0.2.0/24, hosts: [b1]}
caps:
  - {pod: a, egress: 20M, ingress: 20M, window_s: 10}
phases:
  - name: p
    duration_s: 5
    flows:
      - {name: f, protocol: udp, src: a1, dst: b1, rate: 10M}
"""


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("egress: 20M", "egress: -20M", "caps.0.egress"),
        ("egress: 20M", "egress: fast", "'fast'"),
        ("window_s: 10", "window_s: 0", "caps.0.window_s"),
        ("{pod: a,", "{pod: zz,", "unknown pod 'zz'"),
        ("subnet: 10.0.2.0/24", "subnet: 10.0.1.0/24", "overlap"),
        ("subnet: 10.0.2.0/24", "subnet: 10.0.2.1/24", "topology.pods.1.subnet"),
        ("dst: b1", "dst: nobody", "unknown host 'nobody'"),
        ("protocol: udp", "protocol: sctp", "flows.0.protocol"),
        ("rate: 10M", "size: 100", "needs a rate"),
        ("protocol: udp, src: a1, dst: b1, rate: 10M", "protocol: tcp, src: a1, dst: b1, encap: gre", "takes neither"),
        ("duration_s: 5", "duration_s: -1", "phases.0.duration_s"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path: Path, old: str, new: str, expect: str) -> None:
    assert old in BASE
    with pytest.raises(ConfigError) as err:
        load_scenario(_write(tmp_path, BASE.replace(old, new)))
    assert expect in str(err.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(_write(tmp_path, "a: [unclosed"))
    with pytest.raises(ConfigError, match="mapping"):
        load_scenario(_write(tmp_path, "- just a list"))


def test_events_name_a_known_dpu_inside_the_phase(tmp_path: Path) -> None:
    events = BASE.replace("rate: 10M}", "rate: 10M}\n    events:\n      - {at_s: 1, action: restart-dpu, dpu: dpu-a}")
    assert load_scenario(_write(tmp_path, events)).phases[0].events[0].dpu == "dpu-a"
    with pytest.raises(ConfigError, match="unknown DPU 'dpu-z'"):
        load_scenario(_write(tmp_path, events.replace("dpu: dpu-a", "dpu: dpu-z")))
    with pytest.raises(ConfigError, match="after the phase ends"):
        load_scenario(_write(tmp_path, events.replace("at_s: 1", "at_s: 99")))
