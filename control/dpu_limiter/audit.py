"""The audit log's hash chain: every change to the desired state, each record sealing the one before.

A record's hash is SHA-256 over the previous record's hash and the record's canonical JSON, so
editing, reordering or deleting any record breaks every hash after it. Cutting records off the
end cannot be seen from the log alone: a verifier keeps the head hash it last saw (an anchor)
and checks that the log still contains it. The chain has no key: whoever can write the file can
append records that link and hash correctly, so records after the verifier's anchor are only as
trustworthy as the file (`audit log` shows who they say made them). The stored tables are bound
to the log by replaying it (replay.py): a row edited behind the log is a difference.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

GENESIS = "0" * 64


@dataclass(frozen=True)
class AuditRecord:
    """One change: who did what to which object, with the new value."""

    seq: int
    ts: float
    actor: str
    action: str
    object: str
    payload: dict[str, Any]
    prev: str
    hash: str


# json.dumps(..., sort_keys=True, separators=(",", ":")) without making an encoder per record: a fleet's
# write seals tens of thousands.
_BODY = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def seal(seq: int, ts: float, actor: str, action: str, obj: str, payload: dict[str, Any], prev: str) -> str:
    """The hash of a record given the previous record's hash."""
    return seal_encoded(seq, ts, actor, action, obj, _BODY.encode(payload), prev)


def seal_encoded(seq: int, ts: float, actor: str, action: str, obj: str, payload_json: str, prev: str) -> str:
    """`seal`, given the payload as `compact_json` writes it: the canonical body is put together around it
    (keys in order), so that a fleet's write encodes each payload once."""
    body = (
        f'{{"action":{_string(action)},"actor":{_string(actor)},"object":{_string(obj)},"payload":{payload_json},'
        f'"seq":{_number(seq)},"ts":{_number(ts)}}}'
    )
    return hashlib.sha256((prev + body).encode()).hexdigest()


def _number(value: int | float) -> str:
    """A number as the encoder writes it (its repr, for an int or a finite float), without calling it."""
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    return _BODY.encode(value)


def _string(text: str) -> str:
    """A string as the encoder writes it: quoted as it is when it has nothing to escape (printable ASCII
    but quote and backslash: names, actions and most actors), which costs far less than encoding it."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return _BODY.encode(text)


def compact_json(payload: dict[str, Any]) -> str:
    """A payload's canonical JSON (sorted keys, no spaces): its text in the hash, and as stored."""
    return _BODY.encode(payload)


@dataclass(frozen=True)
class Verdict:
    """The result of checking a chain."""

    ok: bool
    records: int
    head: str
    problem: str = ""
    # Which check failed: "chain" (records edited, reordered, deleted or malformed), "anchor" (records
    # cut off the end) or "state" (the stored tables are not what the records say); "" when ok.
    check: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def verify(records: list[AuditRecord], anchor: str | None = None, after: tuple[int, str] = (0, GENESIS)) -> Verdict:
    """Check sequence, links and hashes; with an anchor, also that the log still holds that head. Given `after`
    (a record's sequence number and hash, checked before), the records are the ones that follow it (an anchor
    is then looked for among them and `after` only)."""
    prev = after[1]
    seen_anchor = anchor is None or anchor in (GENESIS, prev)
    for i, r in enumerate(records, start=after[0] + 1):
        if r.seq != i:
            problem = f"record {i}: sequence number is {r.seq} (a record is missing)"
            return Verdict(False, after[0] + len(records), prev, problem, "chain")
        if r.prev != prev:
            problem = f"record {r.seq}: does not link to the record before it"
            return Verdict(False, after[0] + len(records), prev, problem, "chain")
        if seal(r.seq, r.ts, r.actor, r.action, r.object, r.payload, r.prev) != r.hash:
            problem = f"record {r.seq}: contents do not match its hash (edited)"
            return Verdict(False, after[0] + len(records), prev, problem, "chain")
        prev = r.hash
        seen_anchor = seen_anchor or r.hash == anchor
    count = after[0] + len(records)
    if not seen_anchor:
        problem = f"anchor {anchor} is not in the log (records were cut off)"
        return Verdict(False, count, prev, problem, "anchor")
    return Verdict(True, count, prev)
