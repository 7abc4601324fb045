"""`dpu-limiter apply -f` and `get`, as an operator uses them against a running control plane."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpu_limiter.manifest import ManifestError, load_manifest
from helpers.paths import ROOT
from helpers.processes import cli, free_port, stop, wait_port

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
def server(db: str) -> Iterator[str]:
    """`dpu-limiter serve` as a process, as an operator runs it."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "serve",
            "--db",
            db,
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
            "egress": 1e9,
            "ingress": 5e8,
            "window_s": 60.0,
            "burst_bytes": 12500000,
            "mode": "rate",
            "rebalance": False,
        }
    ]
    f.write_text(MANIFEST.replace("egress: 1G", "egress: 2G"))
    assert ("update", "cap", "a") in changes(cli("apply", "-f", str(f), "--json", "--server", server))
    assert "Mbit/s" in cli("apply", "-f", str(f), "--dry-run", "--server", server).stdout  # the readable table


def test_changing_a_dpu_updates_it_in_place(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    f.write_text(MANIFEST.replace("device_id: 1", "device_id: 2"))
    assert changes(cli("apply", "-f", str(f), "--json", "--server", server)) == [
        ("unchanged", "pod", "a"),
        ("unchanged", "pod", "b"),
        ("update", "dpu", "dpu-a"),
        ("unchanged", "cap", "a"),
    ]
    assert json.loads(cli("get", "dpus", "--json", "--server", server).stdout)[0]["device_id"] == 2


def test_a_file_with_one_bad_reference_applies_nothing(tmp_path: Path, db: str, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    before = cli("audit", "log", "--json", "--db", db).stdout
    # A change to pod a's cap, then a cap and a DPU for pods that do not exist: the server refuses the
    # whole file, naming the field, in a dry run too, and pod a's cap stays as it was.
    bad = MANIFEST.replace("egress: 1G", "egress: 2G") + "  - {pod: nosuch, egress: 1G, ingress: 1G, window_s: 60}\n"
    f.write_text(bad)
    for dry in ([], ["--dry-run"]):
        res = cli("apply", "-f", str(f), *dry, "--server", server)
        assert res.returncode == 1, res.stdout
        assert "caps[1].pod: no such pod (got 'nosuch')" in res.stderr and str(f) in res.stderr
    f.write_text(MANIFEST.replace("pod: a}", "pod: zz}").replace("egress: 1G", "egress: 2G"))
    res = cli("apply", "-f", str(f), "--dry-run", "--server", server)
    assert res.returncode == 1 and "dpus[0].pod: no such pod" in res.stderr
    assert json.loads(cli("get", "caps", "--json", "--server", server).stdout)[0]["egress"] == 1e9
    assert cli("audit", "log", "--json", "--db", db).stdout == before


def test_a_file_is_stored_as_one_change(tmp_path: Path, db: str, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    records = json.loads(cli("audit", "log", "--json", "--db", db).stdout)
    assert [r["action"] for r in records] == ["apply-pod", "apply-pod", "register-dpu", "set-cap"]
    assert {r["payload"]["generation"] for r in records} == {1}


def test_delete_by_file_and_by_name(tmp_path: Path, db: str, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)

    def get(kind: str) -> list[str]:
        return [o.get("name", o.get("pod")) for o in json.loads(cli("get", kind, "--json", "--server", server).stdout)]

    # A pod goes only with its DPUs: refused whole, nothing deleted.
    res = cli("delete", "pod", "a", "b", "--server", server)
    assert res.returncode == 1 and "pods[0]: pod still has DPUs ['dpu-a']" in res.stderr
    assert get("pods") == ["a", "b"]
    res = cli("delete", "dpu", "nope", "--server", server)
    assert res.returncode == 1 and "NOT_FOUND" in res.stderr and "'nope'" in res.stderr
    assert changes(cli("delete", "dpu", "nope", "--ignore-not-found", "--json", "--server", server)) == []
    # Dry run: says what would go, and changes nothing.
    want = [("delete", "cap", "a"), ("delete", "dpu", "dpu-a"), ("delete", "pod", "a"), ("delete", "pod", "b")]
    assert changes(cli("delete", "-f", str(f), "--dry-run", "--json", "--server", server)) == want
    assert get("pods") == ["a", "b"] and get("caps") == ["a"]
    assert changes(cli("delete", "cap", "a", "--json", "--server", server)) == [("delete", "cap", "a")]
    assert get("caps") == [] and get("dpus") == ["dpu-a"]
    assert changes(cli("delete", "-f", str(f), "--ignore-not-found", "--json", "--server", server)) == want[1:]
    assert get("pods") == [] and get("dpus") == []
    actions = [r["action"] for r in json.loads(cli("audit", "log", "--json", "--db", db).stdout)]
    assert actions[-4:] == ["delete-cap", "delete-dpu", "delete-pod", "delete-pod"]
    assert cli("audit", "verify", "--db", db).returncode == 0
    assert cli("delete", "--server", server).returncode == 2  # neither a file nor names


def test_get_tables_put_every_value_under_its_column(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    # Pod a's cap sets mode (not rebalance), pod b's rebalance (not mode): their fields come in other orders.
    f.write_text(
        MANIFEST.replace("window_s: 60}", "window_s: 60, mode: window}")
        + "  - {pod: b, egress: 1G, ingress: 1G, window_s: 60, rebalance: true}\n"
    )
    assert cli("apply", "-f", str(f), "--server", server).returncode == 0
    lines = cli("get", "caps", "--server", server).stdout.splitlines()
    header = [c.strip() for c in next(line for line in lines if "┃" in line).split("┃")[1:-1]]
    rows = {}
    for line in lines:
        if "│" in line:
            cells = [c.strip() for c in line.split("│")[1:-1]]
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    assert rows["a"]["mode"] == "window" and rows["a"]["rebalance"] == "False" and rows["a"]["egress"] == "1G"
    assert rows["b"]["mode"] == "rate" and rows["b"]["rebalance"] == "True"


def test_import_a_lab_topology(tmp_path: Path, server: str) -> None:
    topo = ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"
    assert changes(cli("apply", "-f", str(topo), "--json", "--server", server)) == [
        ("create", "pod", "a"),
        ("create", "pod", "b"),
        ("create", "router", "r1"),
    ]
    pods = json.loads(cli("get", "pods", "--json", "--server", server).stdout)
    assert pods == [{"name": "a", "ipv4_prefixes": ["10.0.1.0/24"]}, {"name": "b", "ipv4_prefixes": ["10.0.2.0/24"]}]
    # Routers come with the pods the topology's operator routing puts behind each.
    two = ROOT / "bmv2-lab" / "topologies" / "two-routers.yaml"
    assert ("update", "router", "r1") in changes(cli("apply", "-f", str(two), "--json", "--server", server))
    routers = json.loads(cli("get", "routers", "--json", "--server", server).stdout)
    assert routers == [{"name": "r1", "pods": ["a", "b", "c", "d"]}, {"name": "r2", "pods": ["e", "f", "g", "h"]}]


ROUTERS = "routers:\n  - {name: r1, pods: [a]}\n  - {name: r2, pods: [b]}\n"


def test_routers_are_inventory(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST + ROUTERS)
    assert ("create", "router", "r2") in changes(cli("apply", "-f", str(f), "--json", "--server", server))
    for new, message in (
        ("{name: r2, pods: [a]}", "routers[1].pods: already behind router 'r1'"),
        ("{name: r2, pods: [zz]}", "routers[1].pods: no such pod"),
        ("{name: r2, pods: [b], asn: 1}", "routers[1].asn: unknown key"),
    ):
        f.write_text(MANIFEST + ROUTERS.replace("{name: r2, pods: [b]}", new))
        res = cli("apply", "-f", str(f), "--server", server)
        assert res.returncode in (1, 2) and message in res.stderr, res.stderr
    res = cli("delete", "pod", "b", "--server", server)  # b has no DPU, but router r2 lists it
    assert res.returncode == 1 and "behind routers ['r2']" in res.stderr
    f.write_text(MANIFEST + ROUTERS)
    gone = changes(cli("delete", "-f", str(f), "--json", "--server", server))
    assert gone[:2] == [("delete", "router", "r1"), ("delete", "router", "r2")]
    assert json.loads(cli("get", "all", "--json", "--server", server).stdout) == {
        "pods": [],
        "dpus": [],
        "caps": [],
        "routers": [],
    }


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
        ("window_s: 60}", "window_s: 60, burst: 5}", "caps[0].burst: unknown key"),
        ("pod: a}", "pod: a, colour: red}", "dpus[0].colour: unknown key"),
        ("[10.0.1.0/24]}", "[10.0.1.0/24], cap: 1G}", "pods[0].cap: unknown key"),
        ("  - {pod: a,", "  - {pod: b, egress: 1G, ingress: 1G, window_s: 1}\n  - {pod: b,", "caps[1].pod: named"),
        ("egress: 1G", "egress: 1Q", "caps[0].egress: cannot parse rate '1Q'"),
        ("caps:", "routers: [r1]\nrouting: {pods: {a: r9}}\ncaps:", "routing.pods.a: unknown router"),
        ("caps:", "routers: [r1]\nrouting: {pods: {a: [r1]}}\ncaps:", "routing.pods.a: unknown router"),
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


def test_cap_set_keeps_what_it_is_not_given(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST.replace("window_s: 60}", "window_s: 60, mode: window}"))
    cli("apply", "-f", str(f), "--server", server)
    assert cli("cap", "set", "a", "--egress", "2G", "--ingress", "2G", "--server", server).returncode == 0
    cap = json.loads(cli("get", "caps", "--json", "--server", server).stdout)[0]
    assert (cap["egress"], cap["window_s"], cap["mode"]) == (2e9, 60.0, "window")
    assert "window mode" in cli("cap", "get", "a", "--server", server).stdout
    res = cli(
        "cap", "set", "a", "--egress", "2G", "--ingress", "2G", "--mode", "rate", "--window", "10", "--server", server
    )
    assert res.returncode == 0
    cap = json.loads(cli("get", "caps", "--json", "--server", server).stdout)[0]
    assert (cap["window_s"], cap["mode"]) == (10.0, "rate")
    res = cli("cap", "set", "b", "--egress", "1G", "--ingress", "1G", "--server", server)  # b has no cap yet
    assert res.returncode == 2 and "--window" in res.stderr


def test_get_all_is_a_manifest_apply_takes_back(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    dump = tmp_path / "dump.json"
    dump.write_text(cli("get", "all", "--json", "--server", server).stdout)
    assert all(v == "unchanged" for v, _, _ in changes(cli("apply", "-f", str(dump), "--json", "--server", server)))
    doc = json.loads(dump.read_text())
    doc["caps"][0]["egress"] = 3e9
    dump.write_text(json.dumps(doc))
    assert ("update", "cap", "a") in changes(cli("apply", "-f", str(dump), "--json", "--server", server))
    assert "3G" in cli("get", "all", "--server", server).stdout


def test_usage_watch_piped_prints_each_sample(tmp_path: Path, server: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST)
    cli("apply", "-f", str(f), "--server", server)
    watch = [sys.executable, "-m", "dpu_limiter.cli", "usage", "--watch", "--interval", "0.2", "--server", server]
    proc = subprocess.Popen(watch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        titles = 0
        for line in proc.stdout:  # a table per sample, not one at the end
            titles += "bit/s across each pod's boundary" in line
            if titles == 2:
                break
        assert titles == 2
    finally:
        stop(proc)  # type: ignore[arg-type]
    res = cli("usage", "--json", "--server", server)
    rows = json.loads(res.stdout)["usage"]
    assert rows and all("red_bytes" in r and "dpus_unread" in r for r in rows)  # zeros are printed too
