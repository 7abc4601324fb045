"""`dpu-limiter apply -f` and `get`, as an operator uses them against a running control plane."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, cli, free_port, stop, wait_port
from dpu_limiter.manifest import ManifestError, load_manifest

MANIFEST = """
pods:
  - {name: a, ipv4_prefixes: [10.0.1.0/24]}
  - {name: b, ipv4_prefixes: [10.0.2.0/24, 10.0.3.0/24]}
dpus:
  - {name: dpu-a, p4runtime_address: "127.0.0.1:1", device_id: 1, pod: a}
caps:
  - {pod: a, egress: 1G, ingress: 500M, window_s: 60}
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """`dpu-limiter serve` as a process, as an operator runs it."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "serve",
            "--db",
            str(tmp_path / "s.db"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def changes(res: subprocess.CompletedProcess[str]) -> list[tuple[str, str, str]]:
    assert res.returncode == 0, res.stderr
    return [(c["verb"], c["kind"], c["name"]) for c in json.loads(res.stdout)["changes"]]


def test_dry_run_then_apply_then_nothing_to_do(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    want = [("create", "pod", "a"), ("create", "pod", "b"), ("create", "dpu", "dpu-a"), ("create", "cap", "a")]
    assert changes(cli("apply", "-f", str(f), "--dry-run", "--json", "--server", server)) == want
    assert json.loads(cli("get", "pods", "--json", "--server", server).stdout) == []  # dry run changed nothing
    assert changes(cli("apply", "-f", str(f), "--json", "--server", server)) == want
    assert all(v == "unchanged" for v, _, _ in changes(cli("apply", "-f", str(f), "--json", "--server", server)))
    caps = json.loads(cli("get", "caps", "--json", "--server", server).stdout)
    assert caps == [
        {
            "pod": "a",
            "egress_bps": 1e9,
            "ingress_bps": 5e8,
            "window_s": 60.0,
            "burst_bytes": "12500000",
            "rebalance": False,
            "mode": "CAP_MODE_RATE",
        }
    ]
    f.write_text(MANIFEST.replace("egress: 1G", "egress: 2G"))
    assert ("update", "cap", "a") in changes(cli("apply", "-f", str(f), "--json", "--server", server))
    assert "Mbit/s" in cli("apply", "-f", str(f), "--dry-run", "--server", server).stdout  # the readable table


def test_changing_a_dpu_is_a_conflict_and_applies_nothing(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    f.write_text(MANIFEST.replace("device_id: 1", "device_id: 2").replace("egress: 1G", "egress: 3G"))
    res = cli("apply", "-f", str(f), "--server", server)
    assert res.returncode == 1 and "conflict" in res.stderr
    assert json.loads(cli("get", "caps", "--json", "--server", server).stdout)[0]["egress_bps"] == 1e9


def test_import_a_lab_topology(tmp_path: Path, server: str) -> None:
    topo = ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"
    assert changes(cli("apply", "-f", str(topo), "--json", "--server", server)) == [
        ("create", "pod", "a"),
        ("create", "pod", "b"),
    ]
    pods = json.loads(cli("get", "pods", "--json", "--server", server).stdout)
    assert pods == [{"name": "a", "ipv4_prefixes": ["10.0.1.0/24"]}, {"name": "b", "ipv4_prefixes": ["10.0.2.0/24"]}]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("egress: 1G", "egress: -1G", "caps[0].egress"),
        ("window_s: 60", "window_s: soon", "caps[0].window_s"),
        ("10.0.2.0/24,", "10.0.2.1/24,", "pods[1].ipv4_prefixes[0]"),
        ('"127.0.0.1:1"', '"nowhere"', "dpus[0].p4runtime_address"),
        ("device_id: 1", "device_id: one", "dpus[0].device_id"),
        ("pod: a}", "pod: a, role: spine}", "dpus[0].role"),
        ("caps:", "capz:", "unknown keys ['capz']"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    f = tmp_path / "m.yaml"
    assert old in MANIFEST
    f.write_text(MANIFEST.replace(old, new))
    with pytest.raises(ManifestError) as err:
        load_manifest(f)
    assert message in str(err.value) and str(f) in str(err.value)
    res = cli("apply", "-f", str(f), "--server", "127.0.0.1:1")
    assert res.returncode == 2 and message in res.stderr


def test_the_readme_fleet_example_is_valid_and_applies(server: str, tmp_path: Path) -> None:
    example = ROOT / "examples" / "fleet.yaml"
    m = load_manifest(example)
    assert [d.name for d in m.dpus] == ["a-uplink", "b-node01", "b-node02"] and m.caps["a"].mode == "window"
    # Applied, the control plane dials every DPU: the example's fleet addresses are not this machine's,
    # so the copy applied here names closed loopback ports instead (nothing else changes).
    text = example.read_text()
    for d in m.dpus:
        text = text.replace(f'"{d.p4runtime_address}"', f'"127.0.0.1:{free_port()}"')
    local = tmp_path / "fleet.yaml"
    local.write_text(text)
    assert all(d.p4runtime_address.startswith("127.0.0.1:") for d in load_manifest(local).dpus)
    made = changes(cli("apply", "-f", str(local), "--server", server, "--json"))
    assert {(kind, name) for _, kind, name in made} >= {("pod", "a"), ("dpu", "b-node02"), ("cap", "b")}
    again = changes(cli("apply", "-f", str(local), "--server", server, "--json"))
    assert all(verb == "unchanged" for verb, _, _ in again)
