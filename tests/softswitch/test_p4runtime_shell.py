"""p4runtime-shell, the standard P4Runtime client, programs and reads the embedded target (dpu_softswitch).

p4runtime-shell needs protobuf<3.21, so it runs in its own venv (tests/softswitch/p4rt_shell/env.sh) as a
subprocess: tests/softswitch/p4rt_shell/drive.py does the P4Runtime work and writes what it read as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import BMV2_JSON, P4INFO, ROOT

DRIVE = ROOT / "tests" / "softswitch" / "p4rt_shell" / "drive.py"
METER_CONFIG = {"cir": 2_500_000, "cburst": 250_000, "pir": 2_500_000, "pburst": 250_000}


def shell_python_path() -> Path:
    """The p4runtime-shell venv's interpreter: $DPU_P4RT_SHELL_PYTHON, else <repo>/.venv-p4rt-shell."""
    env = os.environ.get("DPU_P4RT_SHELL_PYTHON")
    return Path(env) if env else ROOT / ".venv-p4rt-shell" / "bin" / "python"


@pytest.fixture
def shell_python() -> Path:
    """The shell's interpreter, or skip (before the target is started) when it is not there."""
    python = shell_python_path()
    if not python.exists():
        pytest.skip(
            f"p4runtime-shell environment not found at {python}; create it with tests/softswitch/p4rt_shell/env.sh"
        )
    return python


@pytest.mark.p4rt_shell
def test_p4runtime_shell_programs_and_reads_target(
    shell_python: Path, embedded_target: tuple[str, Path], tmp_path: Path
) -> None:
    """Pipeline, table entry, meter and counter through p4runtime-shell, each read back as written."""
    for path in (P4INFO, BMV2_JSON):
        assert path.is_file(), f"compiled program {path.relative_to(ROOT)} missing; compile p4/limiter.p4"
    addr, target_log = embedded_target
    out = tmp_path / "result.json"
    # The shell's venv must not see the project's packages (protobuf 6) through the environment.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [
            str(shell_python),
            str(DRIVE),
            "--addr",
            addr,
            "--device-id",
            "1",
            "--p4info",
            str(P4INFO),
            "--json",
            str(BMV2_JSON),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"drive.py exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
            f"\n--- target log\n{target_log.read_text()}"
        )
    result: dict[str, Any] = json.loads(out.read_text())

    entries = result["table_entries"]
    assert len(entries) == 1, entries
    assert entries[0]["table"] == "LimiterIngress.boundary"
    assert entries[0]["match"] == {"standard_metadata.ingress_port": 0}
    assert entries[0]["action"] == {"name": "LimiterIngress.cross", "params": {"port": 1, "cell": 0, "inside": 1}}
    assert entries[0]["priority"] == 0 and entries[0]["is_default_action"] is False
    assert result["meter_entries"] == [
        {"meter": "LimiterIngress.boundary_meter", "index": 0, "config": {**METER_CONFIG, "eburst": 0}}
    ]
    assert result["counter_entries"] == [
        {"counter": "LimiterIngress.class_counter", "index": 0, "data": {"byte_count": 0, "packet_count": 0}}
    ]
