"""Signed, chained evidence of what the verifier measured and what it concluded, checkable offline.

A bundle is a directory holding one file, `evidence.dsse.jsonl`: one DSSE envelope per line (the
standard envelope of in-toto and Sigstore), each signed by the verifier's Ed25519 key and carrying an
in-toto Statement v1 whose predicate is one record:

- `open` (first): when the bundle starts and its scope, the (pod, direction) pairs it covers;
- `window` (one per pair and window): what was measured in [start, end) (the router's bytes, the
  most it counted in any window of the cap, the DPUs' bytes, pipeline digests read back, probes), the
  cap in force and the change-log head that set it, each check's result and the verdict;
- `close` (last): when the bundle ends and how many records it holds.

Every record names its place (`seq`) and the SHA-256 of the payload before it (`prev`), so a record
removed, added or moved breaks the chain at that place; the windows of each pair must tile the bundle's
time from `open` to `close` with no gap, so a window left out is named even with the chain rebuilt;
and each verdict must be the one `judge` gives for its figures, so a signer cannot call a broken cap
held. Anyone with the public key checks a bundle with `dpu-limiter evidence verify DIR --key PUB`,
trusting neither the operator nor the verifier's machine beyond its key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format
from in_toto_attestation.v1 import statement as intoto
from in_toto_attestation.v1 import statement_pb2
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from dpu_limiter.units import MAX_FRAME_BYTES, allowed_window_bytes

BUNDLE_FILE = "evidence.dsse.jsonl"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://dpu-limiter.dev/attestation/cap-window/v1"
DIRECTIONS = ("egress", "ingress")

Check = Literal["pass", "fail", "unverified"]
Verdict = Literal["held", "violated", "unverified"]


@dataclass(frozen=True)
class CapTerms:
    """The cap in force for one pod and direction: rate (bit/s), window (s), bucket (bytes), mode."""

    bps: float
    window_s: float
    burst_bytes: int
    mode: str = "rate"

    def allowance_bytes(self) -> int:
        """Most bytes allowed in any window (units.allowed_window_bytes: window mode has no bucket)."""
        return allowed_window_bytes(self.bps, self.window_s, 0 if self.mode == "window" else self.burst_bytes)


@dataclass(frozen=True)
class ProbeResult:
    """One active probe burst in the window: what its agent sent past the cap, what arrived (authenticated,
    where probes are), what was allowed; where judged for loss, the least that should have arrived; where
    probes are authenticated, the datagrams refused on the probe's port since the last window."""

    sent_bytes: int
    received_bytes: int
    allowed_bytes: int
    # Added with authenticated probes; None is "not recorded", left out of a record (a bundle signed before
    # they existed reads back as written).
    least_bytes: int | None = None
    rejected: int | None = None
    burst: int | None = None


_PROBE_OPTIONAL = ("least_bytes", "rejected", "burst")


@dataclass(frozen=True)
class Balance:
    """A pod's egress running balance at a window's end (balance.py): since when it runs, the least the
    router counted leaving the pod since, what its DPUs say they passed since, and the slack allowed; and,
    at the latest tick `upto` where the router's total is bounded from above (its counters lag), the most
    it can have counted since, what the DPUs said then, and what they may say beyond it."""

    since: float
    router_bytes: int
    dpu_bytes: int
    slack_bytes: int
    upto: float | None = None
    router_most_bytes: int | None = None
    dpu_upto_bytes: int | None = None
    over_slack_bytes: int | None = None

    def short(self) -> bool:
        """Whether the router counted more than the DPUs said, beyond the slack: bytes no DPU passed."""
        return self.dpu_bytes + self.slack_bytes < self.router_bytes

    def over(self) -> bool:
        """Whether the DPUs said more than the router can have counted, beyond the slack: credit banked."""
        if self.router_most_bytes is None or self.dpu_upto_bytes is None or self.over_slack_bytes is None:
            return False
        return self.dpu_upto_bytes > self.router_most_bytes + self.over_slack_bytes


def _record_body(figures: WindowFigures) -> dict[str, Any]:
    """A window's figures as a record holds them: a probe's optional figures, and the balance, only where
    recorded (a bundle signed before they existed reads back as written)."""
    body = dataclasses.asdict(figures)
    body["probes"] = [{k: v for k, v in p.items() if k not in _PROBE_OPTIONAL or v is not None} for p in body["probes"]]
    for optional in ("balance", "router_excess_bytes"):
        if body[optional] is None:
            del body[optional]
    return body


@dataclass(frozen=True)
class WindowFigures:
    """What was measured for one pod and direction in [start, end) (seconds since the epoch)."""

    pod: str
    direction: str
    start: float
    end: float
    cap: CapTerms | None  # None: no cap, the DPUs pass only intra-pod traffic (nothing is judged on rate)
    change_log_seq: int  # the control plane's change-log head when the window ended
    change_log_hash: str
    router_bytes: int  # every byte of every frame the router counted on the pod's link in the window
    # The most it counted in any window of the cap's length ending in this one; None where the router's
    # count is not the cap's to judge (ingress: what heads into a pod has not crossed its DPUs yet).
    router_worst_bytes: int | None
    router_slack_bytes: int  # what the router's sampling may add (its counters read at intervals)
    dpu_bytes: int | None  # what the pod's DPUs say they passed (egress) or metered (ingress); None: unread
    conservation_slack_bytes: int
    pipeline_expected: str  # SHA-256 of the pipeline the control plane installs
    pipelines: dict[str, str] = field(default_factory=dict)  # DPU -> digest read back ("" unread)
    probes: tuple[ProbeResult, ...] = ()
    balance: Balance | None = None  # egress: the running balance, where it spans an interval
    # Rate mode, egress, where the router is read in real time: the most it counted between two readings
    # beyond the cap's rate over their span and the counters' lag, however long the span (the cap allows
    # its bucket and one frame beyond that); None where not judged.
    router_excess_bytes: int | None = None


def judge(f: WindowFigures) -> tuple[dict[str, Check], Verdict]:
    """Each check's result for a window's figures, and the verdict: violated if any check fails, held if
    all pass, unverified otherwise. The one rule for the verifier that signs and for anyone who checks."""
    checks: dict[str, Check] = {}
    if f.cap is not None and f.router_worst_bytes is not None:
        held = f.router_worst_bytes <= f.cap.allowance_bytes() + f.router_slack_bytes
        if f.router_excess_bytes is not None and f.cap.mode == "rate":
            held = held and f.router_excess_bytes <= f.cap.burst_bytes + MAX_FRAME_BYTES
        checks["cap"] = "pass" if held else "fail"
    if f.dpu_bytes is None:
        checks["conservation"] = "unverified"
    else:
        off = abs(f.router_bytes - f.dpu_bytes)
        checks["conservation"] = "pass" if off <= f.conservation_slack_bytes else "fail"
    if f.balance is not None:
        checks["balance"] = "fail" if f.balance.short() or f.balance.over() else "pass"
    reads = list(f.pipelines.values())
    if any(d and d != f.pipeline_expected for d in reads):
        checks["pipeline"] = "fail"
    else:
        checks["pipeline"] = "unverified" if not reads or "" in reads else "pass"
    if f.probes:
        checks["probe"] = "pass" if all(p.received_bytes <= p.allowed_bytes for p in f.probes) else "fail"
        if any(p.least_bytes is not None for p in f.probes):
            lost = any(p.least_bytes is not None and p.received_bytes < p.least_bytes for p in f.probes)
            checks["probe-loss"] = "fail" if lost else "pass"
        if any(p.rejected is not None for p in f.probes):
            checks["probe-forged"] = "fail" if any(p.rejected for p in f.probes) else "pass"
    results = set(checks.values())
    verdict: Verdict = "violated" if "fail" in results else "unverified" if "unverified" in results else "held"
    return checks, verdict


def why(f: WindowFigures, checks: dict[str, Check]) -> str:
    """The failing or unverified checks of a window in words (for alerts and for `evidence verify`)."""
    out = []
    for name, result in checks.items():
        if result == "pass":
            continue
        if name == "cap" and f.cap is not None:
            out.append(
                f"cap {result}: the router counted {f.router_worst_bytes} bytes in {f.cap.window_s:g} s, "
                f"allowed {f.cap.allowance_bytes()} (+{f.router_slack_bytes})"
                + (
                    f"; {f.router_excess_bytes} beyond its rate over some span, allowed {f.cap.burst_bytes}+1 frame"
                    if f.router_excess_bytes
                    else ""
                )
            )
        elif name == "conservation":
            said = "unread" if f.dpu_bytes is None else f"{f.dpu_bytes}"
            out.append(
                f"conservation {result}: router {f.router_bytes} bytes, DPUs {said} (+-{f.conservation_slack_bytes})"
            )
        elif name == "balance" and f.balance is not None:
            b = f.balance
            said = f"balance {result}: since {b.since:.3f} the router counted at least {b.router_bytes} bytes, "
            said += f"DPUs {b.dpu_bytes} (+{b.slack_bytes})"
            if b.upto is not None:
                said += f"; to {b.upto:.3f} at most {b.router_most_bytes}, DPUs {b.dpu_upto_bytes} "
                said += f"(-{b.over_slack_bytes})"
            out.append(said)
        elif name == "pipeline":
            odd = sorted(n for n, d in f.pipelines.items() if d != f.pipeline_expected)
            out.append(f"pipeline {result}: {', '.join(odd) or 'no DPU read'}")
        elif name == "probe":
            worst = max(f.probes, key=lambda p: p.received_bytes - p.allowed_bytes)
            out.append(f"probe {result}: {worst.received_bytes} bytes arrived, allowed {worst.allowed_bytes}")
        elif name == "probe-loss":
            short = min(
                (p for p in f.probes if p.least_bytes is not None),
                key=lambda p: p.received_bytes - (p.least_bytes or 0),
            )
            out.append(f"probe-loss {result}: {short.received_bytes} bytes arrived, at least {short.least_bytes} due")
        elif name == "probe-forged":
            out.append(f"probe-forged {result}: {sum(p.rejected or 0 for p in f.probes)} datagrams refused")
    return "; ".join(out)


def generate_key(path: Path) -> Path:
    """Write a new Ed25519 private key to `path` (PEM, mode 0600) and its public key beside it
    (`path`.pub); returns the public key's path. Refuses to overwrite either."""
    key = ed25519.Ed25519PrivateKey.generate()
    pub = path.with_name(path.name + ".pub")
    for p in (path, pub):
        if p.exists():
            raise FileExistsError(f"{p} exists: not overwritten")
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    pub.write_bytes(public)
    return pub


MAX_KEY_FILE_BYTES = 64 * 1024  # an Ed25519 PEM is under 200 bytes: /dev/zero or a wrong file stops here


def read_key_file(path: Path) -> bytes:
    """A key file's bytes, at most MAX_KEY_FILE_BYTES (ValueError beyond, OSError if unreadable)."""
    with path.open("rb") as f:
        data = f.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"larger than {MAX_KEY_FILE_BYTES} bytes: not a key file")
    return data


def load_signer(path: Path) -> CryptoSigner:
    """The verifier's signer from its private key file (PEM, Ed25519)."""
    key = serialization.load_pem_private_key(read_key_file(path), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return CryptoSigner(key)


def load_public_key(path: Path) -> SSlibKey:
    """A public key file (PEM) as DSSE verification takes it."""
    key = serialization.load_pem_public_key(read_key_file(path))
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return SSlibKey.from_crypto(key)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _subject(name: str, terms: Any) -> dict[str, Any]:
    """An in-toto subject: what a record is about, with the digest of the terms it is judged under."""
    return {"name": name, "digest": {"sha256": hashlib.sha256(_canonical(terms)).hexdigest()}}


class EvidenceWriter:
    """Appends signed, chained records to a new bundle directory (one writer per bundle)."""

    def __init__(
        self,
        directory: Path,
        signer: CryptoSigner,
        scope: Sequence[tuple[str, str]],
        started: float,
        balance_within: int | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / BUNDLE_FILE
        if self.path.exists():
            raise FileExistsError(f"{self.path} exists: a bundle is written once")
        self._signer = signer
        self._seq, self._prev = 0, ""
        self._out = self.path.open("x", encoding="ascii")
        scope_list = [{"pod": p, "direction": d} for p, d in sorted(set(scope))]
        opened: dict[str, Any] = {"kind": "open", "started": started, "scope": scope_list}
        if balance_within is not None:  # a bundle that declares it is held to drawing its balances
            opened["balance_within"] = balance_within
        self._append(_subject("bundle", scope_list), opened)

    def window(self, figures: WindowFigures) -> Verdict:
        """Sign one window's figures with the checks and verdict that `judge` gives; returns the verdict."""
        checks, verdict = judge(figures)
        body = _record_body(figures)
        terms = {"pod": figures.pod, "direction": figures.direction, "cap": body["cap"]}
        record = {"kind": "window", "figures": body, "checks": checks, "verdict": verdict}
        self._append(_subject(f"pod/{figures.pod}/{figures.direction}", terms), record)
        return verdict

    def close(self, ended: float) -> None:
        """Sign the closing record (how many records came before it) and close the file."""
        self._append(_subject("bundle", {"ended": ended}), {"kind": "close", "ended": ended, "records": self._seq})
        self._out.close()

    def _append(self, subject: dict[str, Any], record: dict[str, Any]) -> None:
        predicate = {"seq": self._seq, "prev": self._prev, **record}
        statement = {
            "_type": STATEMENT_TYPE,
            "subject": [subject],
            "predicateType": PREDICATE_TYPE,
            "predicate": predicate,
        }
        payload = _canonical(statement)
        envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
        envelope.sign(self._signer)
        self._out.write(json.dumps(envelope.to_dict(), sort_keys=True) + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())  # a record is evidence only once it is on disk
        self._seq, self._prev = self._seq + 1, hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True)
class BundleCheck:
    """What `verify_bundle` found: ok, how many records verified, and the first problem (naming the record)."""

    ok: bool
    records: int
    windows: int
    verdicts: dict[str, int]  # verdict -> windows
    problem: str = ""
    closed: bool = False


class _Bad(Exception):
    pass


def _figures(i: int, raw: Any) -> WindowFigures:
    """Record `i`'s figures, rebuilt exactly (an unknown, missing or mistyped field is a problem)."""
    try:
        cap, balance = raw["cap"], raw.get("balance")
        probes = tuple(ProbeResult(**p) for p in raw["probes"])
        f = WindowFigures(
            **{
                **raw,
                "cap": None if cap is None else CapTerms(**cap),
                "probes": probes,
                "balance": None if balance is None else Balance(**balance),
            }
        )
        same = _canonical(_record_body(f)) == _canonical(raw)
    except (TypeError, KeyError, ValueError) as exc:
        raise _Bad(f"record {i}: malformed figures: {type(exc).__name__}: {exc}") from None
    if not same:
        raise _Bad(f"record {i}: malformed figures: they do not read back as written")
    if f.direction not in DIRECTIONS or not f.end > f.start:
        raise _Bad(f"record {i}: malformed figures: direction {f.direction!r}, window {f.start}..{f.end}")
    return f


def _records(path: Path, key: SSlibKey) -> Iterator[tuple[int, dict[str, Any], bytes]]:
    """Each record's position, predicate and payload, once its envelope and signature check out."""
    with path.open("rb") as lines:
        for i, line in enumerate(lines):
            try:
                envelope = Envelope.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise _Bad(f"record {i}: not a DSSE envelope ({type(exc).__name__})") from None
            if envelope.payload_type != PAYLOAD_TYPE:
                raise _Bad(f"record {i}: payload type {envelope.payload_type!r}, not {PAYLOAD_TYPE}")
            try:
                envelope.verify([key], 1)
            except VerificationError:
                signers = ", ".join(s.keyid[:16] for s in envelope.signatures.values()) or "nobody"
                raise _Bad(f"record {i}: not signed by key {key.keyid[:16]} (signed by {signers})") from None
            try:
                st = json.loads(envelope.payload)
                intoto.Statement.copy_from_pb(json_format.Parse(envelope.payload, statement_pb2.Statement())).validate()
            except (ValueError, json_format.ParseError) as exc:
                raise _Bad(f"record {i}: not an in-toto Statement v1: {exc}") from None
            if st.get("predicateType") != PREDICATE_TYPE or not isinstance(st.get("predicate"), dict):
                raise _Bad(f"record {i}: predicate type {st.get('predicateType')!r}, not {PREDICATE_TYPE}")
            yield i, st["predicate"], envelope.payload


def _carries_on(where: str, f: WindowFigures, before: _Carried | None) -> None:
    """A running balance goes on from the last one of its pair (same start, no figure falling); it may stop,
    or start again from a new reference, only after a window whose DPUs were not read: one restarted at
    will could hide what adds up."""
    b = f.balance
    if b is not None and b.since > f.start:
        raise _Bad(f"{where}: its balance runs since {b.since:.3f}, after the window's start")
    if before is None:
        return
    j, pb = before.record, before.balance
    if b is None and before.drawn and f.dpu_bytes is not None:
        raise _Bad(f"{where}: the running balance of record {j} stops while the DPUs were read")
    if b is None or pb is None or (b.since != pb.since and before.unread):
        return
    if (
        b.since != pb.since
        or b.router_bytes < pb.router_bytes
        or b.dpu_bytes < pb.dpu_bytes
        or (pb.upto is not None and (b.upto is None or b.upto < pb.upto))
        or (b.router_most_bytes or 0) < (pb.router_most_bytes or 0)
        or (b.dpu_upto_bytes or 0) < (pb.dpu_upto_bytes or 0)
    ):
        raise _Bad(
            f"{where}: its balance (since {b.since:.3f}: router {b.router_bytes}, DPUs {b.dpu_bytes}) does not "
            f"carry on from record {j}'s (since {pb.since:.3f}: router {pb.router_bytes}, DPUs {pb.dpu_bytes})"
        )


@dataclass
class _Carried:
    """A pair's last balance (and its record), whether the window just before had one, and whether a
    window since it had its DPUs unread (after which a balance may start again)."""

    record: int = -1
    balance: Balance | None = None
    drawn: bool = False
    unread: bool = False

    def after(self, i: int, f: WindowFigures) -> _Carried:
        """What carries on past window record `i`."""
        if f.balance is not None:
            return _Carried(i, f.balance, True, False)
        return _Carried(self.record, self.balance, False, self.unread or f.dpu_bytes is None)


def verify_bundle(
    directory: Path, key: SSlibKey, allow_open: bool = False, require_balance: bool = False
) -> BundleCheck:
    """Check a bundle offline: every signature by `key`, the chain, that every window of every pair in
    its scope is there from open to close, and that each verdict follows from its figures (with
    `require_balance`, also that it declares its running balance, and so is held to drawing it)."""
    records = windows = 0
    verdicts: dict[str, int] = {}
    next_start: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], _Carried] = {}  # each pair's balance so far
    within: Any = None  # the open record's balance_within, where it declares one
    waiting: dict[str, int] = {}  # pod -> egress windows since its balance could have been drawn, without one
    closed = False
    path = directory / BUNDLE_FILE
    try:
        if not path.is_file():
            raise _Bad(f"no {BUNDLE_FILE} in {directory}")
        prev = ""
        for i, pred, payload in _records(path, key):
            if closed:
                raise _Bad(f"record {i}: after the close record")
            if pred.get("seq") != i or pred.get("prev") != prev:
                raise _Bad(f"record {i}: out of the chain (seq {pred.get('seq')!r}; prev does not name record {i - 1})")
            prev = hashlib.sha256(payload).hexdigest()
            kind = pred.get("kind")
            if (i == 0) != (kind == "open"):
                raise _Bad(f"record {i}: a {kind!r} record where {'open' if i == 0 else 'a window or close'} belongs")
            if kind == "open":
                next_start = {(s["pod"], s["direction"]): float(pred["started"]) for s in pred["scope"]}
                within = pred.get("balance_within")
                if require_balance and not isinstance(within, int):
                    raise _Bad(f"record {i}: the bundle does not declare its running balance (balance_within)")
            elif kind == "window":
                f = _figures(i, pred.get("figures"))
                where = f"record {i} ({f.pod} {f.direction}, {f.start:.3f}..{f.end:.3f})"
                expected = next_start.get((f.pod, f.direction))
                if expected is None:
                    raise _Bad(f"{where}: not in the bundle's scope")
                if f.start != expected:
                    raise _Bad(f"{where}: a window is missing: the one before ended at {expected:.3f}")
                next_start[(f.pod, f.direction)] = f.end
                carried = last.get((f.pod, f.direction))
                _carries_on(where, f, carried)
                last[(f.pod, f.direction)] = (carried or _Carried()).after(i, f)
                if isinstance(within, int) and f.direction == "egress":
                    # Windows since the DPUs were last unread (or the bundle opened) with no balance drawn.
                    n = 0 if f.balance is not None or f.dpu_bytes is None else waiting.get(f.pod, 0) + 1
                    waiting[f.pod] = n
                    if n > within:
                        raise _Bad(
                            f"{where}: no running balance {n} windows after the DPUs were read (at most {within})"
                        )
                checks, verdict = judge(f)
                if pred.get("checks") != checks or pred.get("verdict") != verdict:
                    raise _Bad(
                        f"{where}: verdict {pred.get('verdict')!r} does not follow from its figures "
                        f"({verdict}: {why(f, checks) or 'every check passes'})"
                    )
                windows += 1
                verdicts[verdict] = verdicts.get(verdict, 0) + 1
            elif kind == "close":
                if pred.get("records") != i:
                    counted = pred.get("records")
                    raise _Bad(f"record {i}: the close record counts {counted!r} records before it, not {i}")
                ended = float(pred["ended"])
                short = sorted(f"{p} {d} (to {t:.3f})" for (p, d), t in next_start.items() if t != ended)
                if short:
                    raise _Bad(f"record {i}: windows missing before the close at {ended:.3f}: {', '.join(short)}")
                closed = True
            else:
                raise _Bad(f"record {i}: unknown kind {kind!r}")
            records += 1
        if records == 0:
            raise _Bad("the bundle is empty")
        if not closed and not allow_open:
            raise _Bad(f"no close record after record {records - 1}: records after it may have been cut")
    except _Bad as exc:
        return BundleCheck(False, records, windows, verdicts, str(exc), closed)
    return BundleCheck(True, records, windows, verdicts, "", closed)
