"""DigestEntry: a P4Info digest's configuration, kept by the digest engine (digests.py)."""

from __future__ import annotations

from collections.abc import Iterator

from finsy.proto import p4r

from .binding import Binding


def write(b: Binding, kind: int, de: p4r.DigestEntry) -> None:
    """Insert, modify or delete one digest's configuration."""
    b.digests.write(kind, de)


def read(b: Binding, req: p4r.DigestEntry) -> Iterator[p4r.Entity]:
    """The digest configuration a read request names."""
    yield p4r.Entity(digest_entry=b.digests.read(req))
