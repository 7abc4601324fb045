"""Per-packet state and the exceptions that end a packet's parse or its processing."""

from __future__ import annotations

from collections.abc import Callable

DROP_PORT = 511  # simple_switch's default drop port; mark_to_drop sets egress_spec to it.


class Packet:
    """Per-packet state: header fields (flat), header validity, the unparsed payload.

    The payload is `payload[poff:]`: the received bytes and where parsing stopped, not a copy, so
    that a deparser emitting the headers unchanged can hand back the received bytes themselves.
    """

    __slots__ = ("exited", "f", "learn", "length", "payload", "poff", "stk", "v")

    def __init__(self, f: list[int], v: list[bool], length: int, stk: list[int] | None = None) -> None:
        self.f = f
        self.v = v
        self.payload = b""
        self.poff = 0
        self.length = length
        self.exited = False
        self.learn = 0  # simple_switch's learn register: the learn list id of the last digest() call
        # Each header stack's next index (bmv2 tracks it apart from the elements' validity).
        self.stk = NO_STACKS if stk is None else stk


NO_STACKS: list[int] = []  # shared by programs without stacks, and the empty action data; never written

Expr = Callable[[Packet, list[int]], int]
Stmt = Callable[[Packet, list[int]], None]


class ParserError(Exception):
    """A parser error with its error code and the offset where parsing stopped."""

    def __init__(self, code: int, offset: int) -> None:
        super().__init__(code)
        self.code = code
        self.offset = offset


class PacketAbort(Exception):
    """An assert/assume failed: bmv2 stops processing the packet."""
