"""`dpu-limiter verify` as a process, with real parts: a control plane on loopback (the caps in force), a real
snmpd (Debian's net-snmp) on loopback whose `lo` stands for the router port facing pod a, and a burst over
loopback far above pod a's cap: the verifier reads it off the router's own counters, raises a router-count
alert, signs a violated window, and the bundle it closes on SIGTERM verifies offline."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_routers import COMMUNITY, SNMPD, free_port, send_udp, start_snmpd

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_verifier.evidence import generate_key
from dpu_verifier.service import ConfigError, load_config
from helpers.paths import ROOT
from helpers.processes import stop

pytestmark = pytest.mark.timeout(120)


def config(tmp_path: Path, cp: str, snmp_port: int, **extra: object) -> Path:
    key = tmp_path / "verifier.key"
    if not key.exists():
        generate_key(key)
    doc = {
        "control_plane": cp,
        "routers": [{"name": "r1", "snmp": f"127.0.0.1:{snmp_port}", "community": COMMUNITY, "ports": {"lo": "a"}}],
        "evidence": str(tmp_path / "evidence"),
        "key": str(key),
        "interval_s": 1,
        "sample_s": 0.5,
        "checks": ["router-count"],
        "counter_lag_s": 0.5,
        **extra,
    }
    path = tmp_path / "verify.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_the_verifier_catches_a_cap_broken_on_the_routers_counters(tmp_path: Path) -> None:
    if SNMPD is None:
        pytest.skip("snmpd (Debian's snmpd package) is not installed")
    snmp_port = free_port()
    snmpd = start_snmpd(tmp_path / "snmpd", snmp_port)
    plane = ControlPlane(tmp_path / "s.db")
    await plane.start()
    verifier = None
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await c.set_pod_cap("a", 8e6, 8e6, 2.0, 400_000)  # 2,401,518 B in any 2 s window
        log = (tmp_path / "verify.log").open("wb")
        cmd = [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "verify",
            "--config",
            str(config(tmp_path, plane.address, snmp_port)),
        ]
        verifier = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        await asyncio.sleep(4)  # a few quiet intervals (the control plane answers on this loop)
        # Ten times the window's allowance at once, through the "router".
        sent = await asyncio.to_thread(send_udp, 20_000_000)
        deadline = time.monotonic() + 30
        while b"check=router-count place=a egress" not in (tmp_path / "verify.log").read_bytes():
            assert time.monotonic() < deadline, (tmp_path / "verify.log").read_text()[-2000:]
            await asyncio.sleep(0.5)
        verifier.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(verifier.wait, 30) == 0
    finally:
        if verifier is not None:
            stop(verifier)
        await plane.stop()
        stop(snmpd)
    (bundle,) = (tmp_path / "evidence").iterdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "evidence",
            "verify",
            str(bundle),
            "--key",
            str(tmp_path / "verifier.key.pub"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["ok"], result
    assert result["verdicts"].get("violated", 0) >= 1  # the window with the burst
    assert sent >= 20_000_000


def test_a_bad_config_names_the_field_and_the_value(tmp_path: Path) -> None:
    path = config(tmp_path, "127.0.0.1:1", 161)
    doc = yaml.safe_load(path.read_text())
    for field, value, named in (
        ("interval_s", 0.1, "interval_s: must be >= 1 s, got 0.1"),
        ("checks", ["read-back", "nope"], "checks: ['nope']"),
        ("routers", [{"name": "r", "snmp": "host", "community": "c", "ports": {"x": "a"}}], "routers[0].snmp"),
        ("control_plane", 7, "control_plane: expected str, got '7'"),
    ):
        path.write_text(yaml.safe_dump({**doc, field: value}))
        with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
            load_config(path)
    done = subprocess.run(
        [sys.executable, "-m", "dpu_limiter.cli", "verify", "--config", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "none.yaml" in done.stderr


def test_the_alert_rules_name_the_verifiers_metrics() -> None:
    rules = yaml.safe_load((ROOT / "verifier" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for metric in ("dpu_verifier_alerts_total", "dpu_verifier_window_held", "dpu_verifier_router_unread_total"):
        assert any(metric in e for e in exprs), metric


def _verify_cli(path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dpu_limiter.cli", "verify", "--config", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"counter_lag_s": float("nan")}, "counter_lag_s: expected a finite number >= 0, got nan"),
        ({"counter_lag_s": -5}, "counter_lag_s: expected a finite number >= 0, got -5"),
        ({"sample_s": float("inf")}, "sample_s: expected a finite number > 0, got inf"),
        ({"interval_s": "10"}, "interval_s: expected a finite number > 0, got '10'"),
        ({"metrics": "127.0.0.1"}, "metrics: expected host:port, got '127.0.0.1'"),
        ({"replicas": ["x" * 100_000]}, "replicas[0]: expected host:port"),
        ({"checks": ["c" * 100_000]}, "checks: ['cccc"),
        ({"key": "/nonexistent/verifier.key"}, "key: cannot read '/nonexistent/verifier.key'"),
        ({"key": "/dev/zero"}, "key: '/dev/zero': not the verifier's key"),
    ],
)
def test_a_bad_number_address_check_or_key_is_refused_before_anything_is_made(
    tmp_path: Path, edit: dict[str, object], named: str
) -> None:
    """Red team, 2026-12-03: each was accepted (then a traceback mid-run, an evidence directory made first) or
    echoed in full; now a bounded one-line error naming the field, exit 2, and no evidence directory."""
    path = config(tmp_path, "127.0.0.1:1", 161)
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, **edit}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert named in str(err.value) and len(str(err.value)) < 500, str(err.value)[:500]
    done = _verify_cli(path)
    assert done.returncode == 2 and named in done.stderr and len(done.stderr) < 500, done.stderr[-500:]
    assert not (tmp_path / "evidence").exists()


def test_a_hostile_config_file_is_refused_by_the_shared_loader(tmp_path: Path) -> None:
    """An alias bomb, 3,000 levels of nesting and /dev/zero get the manifests' limits, not a hang or a traceback."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    (tmp_path / "bomb.yaml").write_text(bomb + "control_plane: *j\n")
    (tmp_path / "deep.yaml").write_text("control_plane: " + "[" * 3000 + "]" * 3000 + "\n")
    for path, named in (
        (tmp_path / "bomb.yaml", "nodes once aliases are expanded"),
        (tmp_path / "deep.yaml", "nested deeper than"),
        (Path("/dev/zero"), "larger than 16777216 bytes"),
    ):
        done = _verify_cli(path)
        assert done.returncode == 2 and named in done.stderr, done.stderr[-500:]
        assert len(done.stderr) < 500 and "Traceback" not in done.stderr
