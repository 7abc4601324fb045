"""The verifier's evidence: signed, chained records that anyone with the public key checks offline, and
the tampering `evidence verify` must name (an edited figure, a removed window, a record re-signed by
another key, records reordered, a verdict its figures do not support, a bundle cut short)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from dpu_verifier.evidence import (
    BUNDLE_FILE,
    Balance,
    CapTerms,
    EvidenceWriter,
    ProbeResult,
    WindowFigures,
    generate_key,
    judge,
    load_public_key,
    load_signer,
    verify_bundle,
)

CAP = CapTerms(8e6, 2.0, 400_000)  # 2,401,518 bytes in any 2 s window
PIPELINE = "ab" * 32
SCOPE = [("a", "egress"), ("a", "ingress"), ("b", "egress"), ("b", "ingress")]
T0 = 1_800_000_000.0


def figures(pod: str, direction: str, start: float, worst: int = 2_000_000, **kw: Any) -> WindowFigures:
    """One window's figures: a cap held, counters that balance, the expected pipeline."""
    base: dict[str, Any] = dict(
        pod=pod,
        direction=direction,
        start=start,
        end=start + 10.0,
        cap=CAP,
        change_log_seq=7,
        change_log_hash="cd" * 32,
        router_bytes=9_000_000,
        router_worst_bytes=worst,
        router_slack_bytes=1518,
        dpu_bytes=9_000_100,
        conservation_slack_bytes=20_000,
        pipeline_expected=PIPELINE,
        pipelines={f"dpu-{pod}": PIPELINE},
        probes=(ProbeResult(3_000_000, 2_400_000, 2_401_518),),
    )
    return WindowFigures(**(base | kw))


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """The verifier's key pair, made with the CLI's own function."""
    return tmp_path / "verifier.key", generate_key(tmp_path / "verifier.key")


def write_bundle(directory: Path, key: Path, windows: int = 3, violate: tuple[int, str, str] | None = None) -> Path:
    """A closed bundle: every pair of SCOPE for `windows` windows of 10 s (one violated if asked)."""
    w = EvidenceWriter(directory, load_signer(key), SCOPE, T0)
    for k in range(windows):
        for pod, direction in SCOPE:
            worst = 3_000_000 if violate == (k, pod, direction) else 2_000_000
            w.window(figures(pod, direction, T0 + 10.0 * k, worst))
    w.close(T0 + 10.0 * windows)
    return directory / BUNDLE_FILE


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def resign(line: str, signer: CryptoSigner, edit: Callable[[dict[str, Any]], None] = lambda s: None) -> str:
    """A record's statement, edited by `edit`, signed again by `signer` alone."""
    env = Envelope.from_dict(json.loads(line))
    statement = json.loads(env.payload)
    edit(statement)
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    out = Envelope(payload=payload, payload_type=env.payload_type, signatures={})
    out.sign(signer)
    return json.dumps(out.to_dict(), sort_keys=True)


def test_a_clean_bundle_verifies_offline_with_the_public_key_alone(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = write_bundle(tmp_path / "bundle", keys[0])
    result = verify_bundle(path.parent, load_public_key(keys[1]))
    assert result.ok, result.problem
    assert (result.records, result.windows, result.verdicts, result.closed) == (14, 12, {"held": 12}, True)
    # The CLI a third party runs, on nothing but the directory and the public key.
    cli = [sys.executable, "-m", "dpu_limiter.cli", "evidence", "verify", str(path.parent), "--key", str(keys[1])]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 14 records, closed; windows: 12 held")
    # Each record is a DSSE envelope of an in-toto Statement v1.
    env = json.loads(lines(path)[1])
    statement = json.loads(base64.b64decode(env["payload"]))
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"][0]["name"] == "pod/a/egress"


def test_a_violated_window_is_signed_as_violated_and_the_bundle_still_verifies(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    path = write_bundle(tmp_path / "bundle", keys[0], violate=(1, "b", "egress"))
    result = verify_bundle(path.parent, load_public_key(keys[1]))
    assert result.ok and result.verdicts == {"held": 11, "violated": 1}


def edit_figure(statement: dict[str, Any]) -> None:
    statement["predicate"]["figures"]["router_worst_bytes"] = 1_000


def drop(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    return lambda ls, _: ls[:i] + ls[i + 1 :]


def swap(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    return lambda ls, _: ls[:i] + [ls[i + 1], ls[i]] + ls[i + 2 :]


def edited_unsigned(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    def tamper(ls: list[str], _: CryptoSigner) -> list[str]:
        env = json.loads(ls[i])
        statement = json.loads(base64.b64decode(env["payload"]))
        edit_figure(statement)
        payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
        env["payload"] = base64.b64encode(payload).decode()
        return ls[:i] + [json.dumps(env)] + ls[i + 1 :]

    return tamper


def other_key(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    return lambda ls, _: ls[:i] + [resign(ls[i], CryptoSigner.generate_ed25519(), edit_figure)] + ls[i + 1 :]


def unsupported_verdict(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    # Signed with the verifier's own key: a verdict of "held" over figures that break the cap.
    def edit(statement: dict[str, Any]) -> None:
        statement["predicate"]["figures"]["router_worst_bytes"] = 3_000_000

    return lambda ls, signer: ls[:i] + [resign(ls[i], signer, edit)] + ls[i + 1 :]


def dropped_and_rechained(i: int) -> Callable[[list[str], CryptoSigner], list[str]]:
    # The whole chain rebuilt after a window is removed, with the verifier's key: the windows' tiling shows it.
    def tamper(ls: list[str], signer: CryptoSigner) -> list[str]:
        kept = ls[:i] + ls[i + 1 :]
        out, prev = [], ""
        for seq, line in enumerate(kept):

            def edit(statement: dict[str, Any], seq: int = seq, prev: str = prev) -> None:
                statement["predicate"]["seq"], statement["predicate"]["prev"] = seq, prev
                if statement["predicate"]["kind"] == "close":
                    statement["predicate"]["records"] = seq

            out.append(resign(line, signer, edit))
            prev = hashlib.sha256(Envelope.from_dict(json.loads(out[-1])).payload).hexdigest()
        return out

    return tamper


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (edited_unsigned(5), "record 5: not signed by key"),
        (other_key(5), "record 5: not signed by key"),
        (unsupported_verdict(5), "record 5 (a egress, 1800000010.000..1800000020.000): verdict 'held' does not follow"),
        (drop(5), "record 5: out of the chain"),
        (dropped_and_rechained(5), "record 8 (a egress, 1800000020.000..1800000030.000): a window is missing"),
        (swap(5), "record 5: out of the chain"),
        (lambda ls, _: ls[:-1], "no close record after record 12"),
        (lambda ls, _: [*ls, ls[-2]], "record 14: after the close record"),
    ],
    ids=[
        "edited-figure",
        "resigned-by-another-key",
        "verdict-not-from-figures",
        "removed-window",
        "removed-window-rechained",
        "reordered",
        "cut-short",
        "appended-after-close",
    ],
)
def test_tampering_fails_evidence_verify_naming_the_record(
    tmp_path: Path,
    keys: tuple[Path, Path],
    tamper: Callable[[list[str], CryptoSigner], list[str]],
    named: str,
) -> None:
    path = write_bundle(tmp_path / "bundle", keys[0])
    path.write_text("\n".join(tamper(lines(path), load_signer(keys[0]))) + "\n")
    result = verify_bundle(path.parent, load_public_key(keys[1]))
    assert not result.ok
    assert result.problem.startswith(named), result.problem
    cli = [sys.executable, "-m", "dpu_limiter.cli", "evidence", "verify", str(path.parent), "--key", str(keys[1])]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and named in done.stdout


def test_a_bundle_being_written_verifies_only_when_allowed_open(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    w = EvidenceWriter(tmp_path / "live", load_signer(keys[0]), SCOPE[:1], T0)
    w.window(figures("a", "egress", T0))
    result = verify_bundle(tmp_path / "live", load_public_key(keys[1]), allow_open=True)
    assert result.ok and not result.closed and result.windows == 1
    assert not verify_bundle(tmp_path / "live", load_public_key(keys[1])).ok


def test_keygen_refuses_to_overwrite_a_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    before = keys[0].read_bytes()
    with pytest.raises(FileExistsError, match="not overwritten"):
        generate_key(keys[0])
    assert keys[0].read_bytes() == before
    assert keys[0].stat().st_mode & 0o777 == 0o600


def test_the_verdict_rule() -> None:
    allowed = CAP.allowance_bytes() + 1518
    assert judge(figures("a", "egress", T0, worst=allowed)) == (
        {"cap": "pass", "conservation": "pass", "pipeline": "pass", "probe": "pass"},
        "held",
    )
    assert judge(figures("a", "egress", T0, worst=allowed + 1))[1] == "violated"
    assert judge(figures("a", "egress", T0, dpu_bytes=None))[1] == "unverified"
    assert judge(figures("a", "egress", T0, dpu_bytes=9_100_000))[0]["conservation"] == "fail"
    assert judge(figures("a", "egress", T0, pipelines={"d": PIPELINE, "e": ""}))[1] == "unverified"
    assert judge(figures("a", "egress", T0, pipelines={"d": "ee" * 32, "e": ""}))[1] == "violated"
    probe = ProbeResult(3_000_000, 2_401_519, 2_401_518)
    assert judge(figures("a", "egress", T0, probes=(probe,)))[0]["probe"] == "fail"
    window_mode = dataclasses.replace(CAP, mode="window")
    assert window_mode.allowance_bytes() == CAP.allowance_bytes() - 400_000


def write_balanced(directory: Path, key: Path, windows: int = 4) -> Path:
    """A closed bundle of pod a's egress whose running balance goes on from the first window."""
    w = EvidenceWriter(directory, load_signer(key), SCOPE[:1], T0)
    for k in range(windows):
        n = k + 1
        balance = Balance(T0, 9_000_000 * n, 9_000_100 * n, 6072, T0 + 10.0 * k + 5, 9_100_000 * n, 9_000_000 * n, 9000)
        w.window(figures("a", "egress", T0 + 10.0 * k, balance=balance))
    w.close(T0 + 10.0 * windows)
    return directory / BUNDLE_FILE


def balance_edit(i: int, edit: Callable[[dict[str, Any]], None]) -> Callable[[list[str], CryptoSigner], list[str]]:
    # Re-signed with the verifier's own key, verdict and checks made to follow: only the balance's rules show it.
    def tamper(ls: list[str], signer: CryptoSigner) -> list[str]:
        def change(statement: dict[str, Any]) -> None:
            figs = statement["predicate"]["figures"]
            edit(figs)
            f = WindowFigures(**{**figs, "cap": CAP, "probes": (), "balance": _balance(figs.get("balance"))})
            statement["predicate"]["checks"], statement["predicate"]["verdict"] = judge(f)
            figs["probes"] = []

        return ls[:i] + [resign(ls[i], signer, change)] + ls[i + 1 :]

    return tamper


def place(i: int) -> str:
    """How `evidence verify` names window record `i` of `write_balanced`'s bundle."""
    return f"record {i} (a egress, {T0 + 10.0 * (i - 1):.3f}..{T0 + 10.0 * i:.3f})"


def _balance(raw: dict[str, Any] | None) -> Balance | None:
    return None if raw is None else Balance(**raw)


def test_a_running_balance_verifies_and_a_shortfall_is_violated(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = write_balanced(tmp_path / "bundle", keys[0])
    result = verify_bundle(path.parent, load_public_key(keys[1]))
    assert result.ok and result.verdicts == {"held": 4}, result
    short = figures("a", "egress", T0, balance=Balance(T0, 9_000_000, 8_000_000, 6072))
    checks, verdict = judge(short)
    assert checks["balance"] == "fail" and verdict == "violated"
    # DPUs that said more than the router can have counted (credit for hiding later): violated too.
    said_more = Balance(T0, 9_000_000, 9_000_000, 6072, T0 + 5, 9_000_000, 9_100_000, 9000)
    assert judge(figures("a", "egress", T0, balance=said_more))[0]["balance"] == "fail"


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (
            balance_edit(2, lambda f: f["balance"].update(since=T0 + 10.0)),
            f"{place(2)}: its balance (since 1800000010.000",
        ),
        (
            balance_edit(2, lambda f: f.pop("balance")),
            f"{place(2)}: the running balance of record 1 stops",
        ),
        (
            balance_edit(3, lambda f: f["balance"].update(router_bytes=1)),
            f"{place(3)}: its balance",
        ),
        (
            balance_edit(1, lambda f: f["balance"].update(since=T0 + 5.0)),
            f"{place(1)}: its balance runs since",
        ),
        (
            balance_edit(3, lambda f: f["balance"].update(upto=None)),
            f"{place(3)}: its balance",
        ),
    ],
    ids=["restarted-while-read", "stopped-while-read", "router-figure-fell", "since-after-start", "bound-dropped"],
)
def test_a_balance_restarted_or_cut_to_hide_a_shortfall_fails_naming_the_record(
    tmp_path: Path,
    keys: tuple[Path, Path],
    tamper: Callable[[list[str], CryptoSigner], list[str]],
    named: str,
) -> None:
    path = write_balanced(tmp_path / "bundle", keys[0])
    path.write_text("\n".join(tamper(lines(path), load_signer(keys[0]))) + "\n")
    result = verify_bundle(path.parent, load_public_key(keys[1]))
    assert not result.ok
    assert result.problem.startswith(named), result.problem


def test_a_balance_may_stop_where_the_dpus_were_not_read(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    w = EvidenceWriter(tmp_path / "b", load_signer(keys[0]), SCOPE[:1], T0)
    w.window(figures("a", "egress", T0, balance=Balance(T0, 9_000_000, 9_000_100, 6072)))
    w.window(figures("a", "egress", T0 + 10, dpu_bytes=None))  # a DPU restarted: the balance starts again
    w.window(figures("a", "egress", T0 + 20, balance=Balance(T0 + 20, 9_000_000, 9_000_100, 6072)))
    w.close(T0 + 30)
    result = verify_bundle(tmp_path / "b", load_public_key(keys[1]))
    assert result.ok, result.problem
