"""The command line: help on every command, clear errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


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
    src = Path(__file__).resolve().parent.parent / "bmv2-lab" / "scenarios" / "two-pods.yaml"
    text = src.read_text().replace("egress: 20M", "egress: -20M", 1)
    bad.write_text(text.replace("../topologies/two-pods.yaml", str(src.parent.parent / "topologies/two-pods.yaml")))
    res = cli("lab", "run", str(bad), "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "caps.0.egress" in res.stderr and "-20M" in res.stderr


def test_bad_rate_at_the_cli(tmp_path: Path) -> None:
    res = cli("cap", "set", "a", "--egress", "lots", "--ingress", "1G", "--window", "60", "--server", "127.0.0.1:1")
    assert res.returncode == 2
    assert "--egress" in res.stderr and "lots" in res.stderr


def test_unreachable_server_is_a_clear_error() -> None:
    res = cli("status", "--server", "127.0.0.1:1")
    assert res.returncode == 1
    assert "UNAVAILABLE" in res.stderr


@pytest.mark.parametrize(
    ("flag", "value"), [("--max-installs", "0"), ("--max-reconciles", "-3"), ("--resync-s", "0"), ("--lease-s", "nan")]
)
def test_bad_serve_settings_name_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    res = cli("serve", "--db", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0", flag, value)
    assert res.returncode == 2
    assert flag in res.stderr and value in res.stderr
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened
