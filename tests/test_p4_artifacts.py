"""The committed bmv2 JSON and P4Info (p4/ and the test corpus) are what p4c makes of the committed source."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "p4").glob("*.p4")) + sorted((ROOT / "tests" / "softswitch" / "corpus").glob("*.p4"))


@pytest.mark.parametrize("src", PROGRAMS, ids=lambda p: p.name)
def test_artifacts_committed(src: Path) -> None:
    assert src.with_suffix(".json").is_file(), f"{src.name}: compiled JSON missing; run `make p4`"
    assert src.with_suffix(".p4info.txtpb").is_file(), f"{src.name}: P4Info missing; run `make p4`"


def _normalise(doc: dict) -> dict:  # type: ignore[type-arg]
    # Source paths in the JSON's annotations depend on where p4c ran; compare everything else.
    text = json.dumps(doc, sort_keys=True)
    return json.loads(text.replace(str(ROOT) + "/", ""))


@pytest.mark.p4c
@pytest.mark.parametrize("src", PROGRAMS, ids=lambda p: p.name)
def test_artifacts_not_stale(src: Path, tmp_path: Path) -> None:
    p4c = shutil.which("p4c-bm2-ss")
    if p4c is None:
        pytest.skip("p4c-bm2-ss is not on PATH: cannot check the committed artifacts are current")
    out, info = tmp_path / "out.json", tmp_path / "out.p4info.txtpb"
    subprocess.run(
        [p4c, "--arch", "v1model", "--std", "p4-16", "--p4runtime-files", str(info), "-o", str(out), src.name],
        check=True,
        cwd=src.parent,
    )
    committed = json.loads(src.with_suffix(".json").read_text())
    assert _normalise(json.loads(out.read_text())) == _normalise(committed), (
        f"{src.with_suffix('.json').name} is stale: run `make p4` and commit"
    )
    assert info.read_text() == src.with_suffix(".p4info.txtpb").read_text(), (
        f"{src.with_suffix('.p4info.txtpb').name} is stale: run `make p4` and commit"
    )
