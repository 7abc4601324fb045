"""Where the repository and its compiled limiter.p4 are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


P4INFO = ROOT / "p4" / "limiter.p4info.txtpb"


BMV2_JSON = ROOT / "p4" / "limiter.json"
