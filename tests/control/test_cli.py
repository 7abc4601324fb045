"""The command line: help on every command, clear errors for bad input."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dpu_limiter.server import ControlPlane
from helpers.paths import ROOT
from helpers.processes import free_port, stop, wait_port


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpu_limiter.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [[], ["lab", "run"], ["serve"], ["target"], ["cap", "set"], ["usage"], ["status"]])
def test_help(args: list[str]) -> None:
    res = cli(*args, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


def test_target_help_has_simple_switch_options() -> None:
    out = cli("target", "--help").stdout
    for opt in ("--device-id", "-i", "--grpc-server-addr", "--no-p4"):
        assert opt in out


def test_bad_scenario_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    src = ROOT / "bmv2-lab" / "scenarios" / "two-pods.yaml"
    text = src.read_text().replace("egress: 20M", "egress: -20M", 1)
    bad.write_text(text.replace("../topologies/two-pods.yaml", str(src.parent.parent / "topologies/two-pods.yaml")))
    res = cli("lab", "run", str(bad), "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "caps[0].egress" in res.stderr and "-20M" in res.stderr


def test_bad_rate_at_the_cli(tmp_path: Path) -> None:
    res = cli("cap", "set", "a", "--egress", "lots", "--ingress", "1G", "--window", "60", "--server", "127.0.0.1:1")
    assert res.returncode == 2
    assert "--egress" in res.stderr and "lots" in res.stderr


def test_unreachable_server_is_a_clear_error() -> None:
    res = cli("status", "--server", "127.0.0.1:1")
    assert res.returncode == 1
    assert "UNAVAILABLE" in res.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-installs", "0"),
        ("--max-reconciles", "-3"),
        ("--resync-s", "0"),
        ("--lease-s", "nan"),
        ("--listen", "127.0.0.1:70000"),
        ("--metrics-listen", "bogus"),
    ],
)
def test_bad_serve_settings_name_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    res = cli("serve", "--db", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0", flag, value)
    assert res.returncode == 2
    assert flag in res.stderr and value in res.stderr
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened


def test_a_port_in_use_is_refused_not_shared(tmp_path: Path) -> None:
    """A second control plane on a taken port must not share it (SO_REUSEPORT) and answer half the calls."""
    port, metrics = free_port(), free_port()
    first = subprocess.Popen(
        [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", str(tmp_path / "1.db")]
        + ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, first)
        wait_port(metrics, first)
        res = cli("serve", "--db", str(tmp_path / "2.db"), "--listen", f"127.0.0.1:{port}")
        assert res.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in res.stderr
        res = cli(
            "serve",
            "--db",
            str(tmp_path / "3.db"),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            f"127.0.0.1:{metrics}",
        )
        assert res.returncode == 2 and "metrics endpoint: cannot listen" in res.stderr
        assert "Traceback" not in res.stderr
    finally:
        stop(first)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cap", "set", "a", "--egress", "1G", "--ingress", "1G", "--burst", "-5"], "--burst"),
        (["usage", "--watch", "--interval", "0"], "--interval"),
        (["status", "--tls-dir", "/nonexistent"], "TLS CA /nonexistent/ca.pem"),
    ],
)
def test_bad_client_flags_name_the_flag(args: list[str], message: str) -> None:
    res = cli(*args, "--server", "127.0.0.1:1")
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_certs_keep_what_was_issued(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert cli("certs", "init", str(pki)).returncode == 0
    ca = (pki / "ca.pem").read_bytes()
    res = cli("certs", "init", str(pki))
    assert res.returncode == 2 and "--force" in res.stderr and (pki / "ca.pem").read_bytes() == ca
    for bad, message in (
        (["../escape", "--role", "operator"], "name"),
        (["x", "--role", "operator", "--days", "0"], "--days"),
        (["ca", "--role", "operator"], "name"),  # would overwrite the CA
        (["verifier", "--role", "operator"], "exists"),
    ):
        res = cli("certs", "issue", str(pki), *bad)
        assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not (tmp_path / "escape.pem").exists() and not (pki / "x.pem").exists()
    # A DPU's server certificate from the same CA, for its P4Runtime server's TLS.
    assert cli("certs", "issue", str(pki), "dpu-a.rack1", "--host", "127.0.0.1").returncode == 0
    assert (pki / "ca.pem").read_bytes() == ca and (pki / "dpu-a.rack1.key").exists()
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((pki / "dpu-a.rack1.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cli("certs", "init", str(pki), "--force").returncode == 0 and (pki / "ca.pem").read_bytes() != ca


async def test_status_of_no_dpu_says_why_its_table_is_empty(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0")
    await plane.start()
    try:
        for args, said in ((["status"], "no DPU is registered"), (["status", "--held-here"], "holds no DPU")):
            res = await asyncio.to_thread(cli, *args, "--server", plane.address)
            assert res.returncode == 0 and said in res.stdout, (res.stdout, res.stderr)
    finally:
        await plane.stop()
