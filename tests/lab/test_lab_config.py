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
        ("egress: 20M", "egress: -20M", "caps[0].egress"),
        ("egress: 20M", "egress: fast", "'fast'"),
        ("window_s: 10", "window_s: 0", "caps[0].window_s"),
        ("{pod: a,", "{pod: zz,", "unknown pod 'zz'"),
        ("subnet: 10.0.2.0/24", "subnet: 10.0.1.0/24", "overlap"),
        ("subnet: 10.0.2.0/24", "subnet: 10.0.2.1/24", "topology.pods[1].subnet"),
        ("dst: b1", "dst: nobody", "unknown host 'nobody'"),
        ("protocol: udp", "protocol: sctp", "phases[0].flows[0].protocol"),
        ("rate: 10M", "size: 100", "needs a rate"),
        ("protocol: udp, src: a1, dst: b1, rate: 10M", "protocol: tcp, src: a1, dst: b1, encap: gre", "takes neither"),
        ("duration_s: 5", "duration_s: -1", "phases[0].duration_s"),
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
        ("window_s: 10", "window_s: 1e-300", "caps[0].window_s: must be 0.1..86400 seconds (got 1e-300)"),
        ("window_s: 10", "window_s: 0.5, mode: window", "caps[0].window_s: must be >= 1 second in window mode"),
        ("egress: 20M", "egress: 1k", "caps[0].egress: must be >= 16000 bit/s"),
        ("window_s: 10}", "window_s: 10, burst_bytes: 0}\n  - {pod: b, egress: 2T, ingress: 1G, window_s: 10}", "<="),
        (
            "rate: 10M}",
            "rate: 10M}\n    events:\n      - {at_s: 1, action: set-cap, pod: a, egress: 1k, ingress: 1M}",
            "phases[0].events[0].egress: must be >= 16000 bit/s",
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


FAILOVER = ROOT / "bmv2-lab" / "scenarios" / "failover.yaml"


def _replicas_scenario(tmp_path: Path, control_plane: dict[str, object], events: list[dict[str, object]]) -> Path:
    """failover.yaml with this control_plane section and these events (its topology inline)."""
    import yaml

    doc = yaml.safe_load(FAILOVER.read_text())
    doc["topology"] = yaml.safe_load((FAILOVER.parent / doc["topology"]).read_text())
    doc["control_plane"] = control_plane
    doc["phases"][0]["events"] = events
    path = tmp_path / "replicas.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    text = str(err.value)
    assert len(text) < 2000 and "(top level)" not in text and "Value error" not in text, text
    return text


def test_a_replica_lease_not_below_a_third_of_the_dpu_lease_is_refused(tmp_path: Path) -> None:
    """Red team, 2026-12-04: DPU lease 6 s, replica lease 12 s loaded; a 14 s pause let the DPUs' leases lapse
    (the stalled replica kept them until its own lease ran out). serve's defaults stand in for an omitted one."""
    from dpu_limiter.units import DEFAULT_LEASE_S, REPLICA_LEASE_S

    text = _refusal(_replicas_scenario(tmp_path, {"replicas": 3, "lease_s": 6, "replica_lease_s": 12}, []))
    assert "control_plane.replica_lease_s: 12 must be below a third of control_plane.lease_s (6)" in text, text
    exactly = _replicas_scenario(tmp_path, {"replicas": 3, "lease_s": 24, "replica_lease_s": 8}, [])
    assert "control_plane.replica_lease_s: 8 must be below a third" in _refusal(exactly)
    # The DPUs' lease omitted: serve's default.
    long_replica = DEFAULT_LEASE_S / 3 + 1
    text = _refusal(_replicas_scenario(tmp_path, {"replicas": 2, "replica_lease_s": long_replica}, []))
    assert f"({DEFAULT_LEASE_S:g}, serve's default)" in text and f"replica_lease_s: {long_replica:g}" in text, text
    # The replica lease omitted: serve's default, and the DPUs' lease given is the field named.
    short = 2.5 * REPLICA_LEASE_S
    text = _refusal(_replicas_scenario(tmp_path, {"replicas": 2, "lease_s": short}, []))
    assert f"control_plane.lease_s: {short:g} must be more than three times control_plane.replica_lease_s" in text
    assert f"({REPLICA_LEASE_S:g}, serve's default)" in text, text
    # Accepted: the shipped failover scenario, serve's defaults, and one control plane (no replica lease) with a
    # short DPU lease.
    assert load_scenario(FAILOVER).control_plane.replica_lease() < load_scenario(FAILOVER).control_plane.dpu_lease() / 3
    load_scenario(_replicas_scenario(tmp_path, {"replicas": 2}, []))
    assert load_scenario(_replicas_scenario(tmp_path, {"replicas": 1, "lease_s": short}, [])).control_plane.lease_s


def test_replica_events_that_cannot_run_as_written_are_refused_naming_the_field(tmp_path: Path) -> None:
    """Red team, 2026-12-04: `down_s` on a kill was ignored, a restart-db past its phase's end accepted, killing
    more replicas than ran ended in a misleading UNAVAILABLE, and 500 start-replicas-at-once events loaded."""
    cp = {"replicas": 2, "lease_s": 24, "replica_lease_s": 4}
    kill = {"at_s": 3, "action": "kill-replica", "pod": "a"}
    text = _refusal(_replicas_scenario(tmp_path, cp, [{**kill, "down_s": 2}]))
    assert "phases[0].events[0].down_s: kill-replica lasts no time" in text, text
    text = _refusal(_replicas_scenario(tmp_path, cp, [{"at_s": 60, "action": "restart-db", "down_s": 5}]))
    assert "phases[0].events[0].down_s: 5 s from at_s 60 runs past the phase's end (62 s)" in text, text
    # Two kills of two replicas: the second would leave none; a start before it gives it one to spare.
    text = _refusal(_replicas_scenario(tmp_path, cp, [kill, {**kill, "at_s": 9}]))
    assert "phases[0].events[1].action: kill-replica would leave no live replica" in text, text
    start = {"at_s": 5, "action": "start-replicas-at-once"}
    assert load_scenario(_replicas_scenario(tmp_path, cp, [kill, start, {**kill, "at_s": 9}]))
    # A kill at the very time of a start is counted first: the new replicas may not have joined.
    _refusal(_replicas_scenario(tmp_path, cp, [kill, {**start, "at_s": 9}, {**kill, "at_s": 9}]))
    # Each event's count is bounded, and so are all of them together.
    from dpu_lab.config import DEFAULT_START_COUNT, MAX_REPLICAS

    events = MAX_REPLICAS // DEFAULT_START_COUNT + 1
    text = _refusal(_replicas_scenario(tmp_path, cp, [{**start, "at_s": i} for i in range(events)]))
    assert f"phases[0].events[{events - 1}].count: the start-replicas-at-once events together start" in text, text
    assert f"at most {MAX_REPLICAS} in a run" in text, text
    assert load_scenario(_replicas_scenario(tmp_path, cp, [{**start, "at_s": i} for i in range(events - 1)]))


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        (
            "rate: 10M}",
            "rate: 10M}\n    events:\n      - {at_s: 9, action: restart-dpu, dpu: dpu-a}",
            "phases[0].events[0].at_s: 9.0 is after the phase ends",
        ),
        ("hosts: [b1]}", "hosts: [b1], uplinks: 2, placement: node}", "topology.pods[1].uplinks: 2 parallel uplinks"),
        ("{pod: a,", "{pod: zz,", "caps[0].pod: unknown pod 'zz'"),
        (
            "rate: 10M}",
            "rate: 10M}\n    events:\n      - {at_s: 1, action: compromise, dpu: dpu-a}",
            "phases[0].events[0].how: a compromise needs how",
        ),
    ],
    ids=["scenario", "topology-pod", "cap", "event"],
)
def test_cross_field_refusals_name_the_field_path_in_one_style(tmp_path: Path, old: str, new: str, expect: str) -> None:
    """Red team, 2026-12-04: cross-field checks read "(top level): Value error, phases[0]... (got dict)", and
    paths were written both phases.0 and phases[0]; now every refusal names FIELD[i].PATH first."""
    assert old in BASE
    text = _refusal(_write(tmp_path, BASE.replace(old, new)))
    line = text.splitlines()[1].strip()
    assert line.startswith(expect) and "(got {" not in line and "got dict" not in line, text
