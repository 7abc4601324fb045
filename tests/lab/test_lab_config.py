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


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("window_s: 10", "window_s: 1e-300", "cap.window_s: must be 0.1..86400 seconds (got 1e-300)"),
        ("window_s: 10", "window_s: 0.5, mode: window", "cap.window_s: must be >= 1 second in window mode"),
        ("egress: 20M", "egress: 1k", "cap.egress_bps: must be >= 16000 bit/s"),
        ("window_s: 10}", "window_s: 10, burst_bytes: 0}\n  - {pod: b, egress: 2T, ingress: 1G, window_s: 10}", "<="),
        (
            "rate: 10M}",
            "rate: 10M}\n    events:\n      - {at_s: 1, action: set-cap, pod: a, egress: 1k, ingress: 1M}",
            "phases[0].events[0]: cap.egress_bps",
        ),
    ],
    ids=["tiny-window", "window-mode-short", "slow-rate", "fast-rate", "set-cap-event"],
)
def test_caps_the_control_plane_would_refuse_are_refused_at_load(
    tmp_path: Path, old: str, new: str, expect: str
) -> None:
    """Red team, 2026-12-03: window_s 1e-300 loaded, the lab built everything, then the control plane refused
    it and `lab run` ended in a traceback; the control plane's own cap validation now runs at load."""
    assert old in BASE
    with pytest.raises(ConfigError) as err:
        load_scenario(_write(tmp_path, BASE.replace(old, new)))
    assert expect in str(err.value) and len(str(err.value)) < 2000, str(err.value)


def test_a_topology_that_is_not_a_mapping_is_refused_without_its_contents(tmp_path: Path) -> None:
    """Red team, 2026-12-03: `topology: /etc/shadow` printed its lines; now only the path is named."""
    secret = tmp_path / "secret"
    secret.write_text("root:*:20228:0:99999:7:::\ndaemon:SECRET-HASH:20228:0:99999:7:::\n")
    listing = tmp_path / "list.yaml"
    listing.write_text("- SECRET-ITEM\n")
    for target in (secret, listing):
        with pytest.raises(ConfigError) as err:
            load_scenario(_write(tmp_path, f"name: t\ntopology: {target}\ncaps: []\nphases: []\n"))
        text = str(err.value)
        assert str(target) in text and "not a topology" in text, text
        assert "SECRET" not in text and "root:" not in text, text


def test_a_control_plane_refusal_during_lab_run_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cap the control plane refuses mid-run (after the run cleaned up, in LabRun.run's finally) ends
    `lab run` with one bounded line and exit 2, not a traceback."""
    import argparse

    import grpc

    from dpu_lab import cli, runner

    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INVALID_ARGUMENT

        def details(self) -> str:
            return "cap.window_s: must be 0.1..86400 seconds (got " + "9" * 100_000 + ")"

    def refuse(self: object) -> None:
        raise Refused()

    monkeypatch.setattr(runner.LabRun, "run", refuse)
    args = argparse.Namespace(
        scenario=_write(tmp_path, BASE),
        time="real",
        traffic="scapy",
        out=tmp_path / "o",
        target="bmv2",
        no_calibrate=True,
        rescale=False,
        control_db=None,
        control_db_ctl=None,
    )
    assert cli._lab_run(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600, err[:600]
    assert "INVALID_ARGUMENT" in err and "cap.window_s" in err and "cleaned up" in err
