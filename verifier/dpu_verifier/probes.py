"""Authenticated active probes: the agent a pod runs, and the receiver that counts what reaches the verifier.

The agent (`dpu-limiter probe-agent run`, or `python -m dpu_verifier.probe_agent run`) sends a burst of UDP
datagrams at the start of every period, on an absolute schedule shared with the verifier (burst k starts at
`start_at + k * period_s`). Every datagram carries, in network byte order:

    magic "DLP1" | pod name length (u8) | pod name | burst (u32) | seq (u32, from 0 in each burst)
    | send time (f64, UNIX seconds) | the previous burst: datagrams sent (u32), payload bytes sent (u64),
    first to last send (u32, microseconds) | zero padding to the payload size | HMAC-SHA256 (32 bytes)

The tag covers the destination port and every byte before it, under a 32-byte key the agent shares with
the verifier (`dpu-limiter probe-agent keygen`; one key per pod, so that a host of one pod cannot speak for
another). The receiver (`ProbeReceiver`) takes a datagram only if its tag verifies, it names the pod its
port is registered for, its (burst, seq) was not taken before, and its stamp can be true (finite; not
before the schedule's first burst nor after the datagram arrived; in the burst it claims; arriving before
the end of the next period). Anything else is counted apart by reason, never as probe bytes: a DPU that
rewrites, truncates or replays probes, or a host that feeds another pod's probe, shows as rejections, and
one that drops probes shows as a burst that got far less than the cap left free (checks.Auditor).

This module imports only the standard library and dpu_limiter.units: the agent starts in a pod's host.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import math
import os
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

MAGIC = b"DLP1"
KEY_BYTES = 32
TAG_BYTES = 32
MAX_POD_BYTES = 63
MAX_UDP_PAYLOAD = 65507
HEAD = struct.Struct("!4sB")  # magic, pod name length
BODY = struct.Struct("!IIdIQI")  # burst, seq, sent, previous burst: datagrams, payload bytes, span (us)
PORT = struct.Struct("!H")  # the destination port, under the tag only (a datagram redirected fails)
UDP_WIRE_OVERHEAD = 8 + 20 + 14  # UDP + IPv4 (no options) + Ethernet: what a datagram costs on the wire
MAX_BURST = 0xFFFFFFFF  # bursts are numbered in a u32 (and NO_REPORT is its largest value)
# An agent waits at most this long for its first burst: a --start-at further ahead is a mistake (1e300 would
# wait for ever, sending nothing, and exit 0 as if it had run).
MAX_START_AHEAD_S = 366 * 86400
NO_REPORT = 0xFFFFFFFF  # "previous burst: not sent by this agent" (it started after it)
# Linux's SO_TIMESTAMPNS (asm-generic/socket.h; Python's socket module does not name it): when the kernel
# received each datagram, as a timespec. Judging by it makes the judgement independent of when we read.
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("@qq")
# Send errors an agent counts and goes on after (a full qdisc on a busy host).
_COUNTED_SEND_ERRORS = {errno.ENOBUFS, errno.EAGAIN}
# Bytes of a value an error message quotes: errors stay bounded whatever was passed.
_QUOTE = 60

Rejection = Literal["malformed", "bad-mac", "other-pod", "replay", "stale", "implausible"]
# What only a forger makes (the probe-forged alert). A `stale` datagram is refused but not one of them: a
# loaded target that held an honest datagram past its burst's deadline cannot be told from a replay of an
# old burst, neither is counted, so neither helps a cheat, and holding probes back shows as probe-loss.
FORGERY: frozenset[Rejection] = frozenset({"malformed", "bad-mac", "other-pod", "replay", "implausible"})


class ProbeError(ValueError):
    """Bad probe input (a key file, an argument), naming the field and the value."""


def quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def wire_bytes(payload: int) -> int:
    """What a UDP datagram of `payload` bytes costs on an Ethernet wire (as routers count it)."""
    return payload + UDP_WIRE_OVERHEAD


def min_payload(pod: str) -> int:
    """The smallest payload a datagram of `pod` fits in."""
    return HEAD.size + len(pod.encode()) + BODY.size + TAG_BYTES


def check_pod(pod: str) -> str:
    """`pod` if it can name a probe's pod (1..63 bytes of UTF-8), else ProbeError."""
    if not 1 <= len(pod.encode()) <= MAX_POD_BYTES:
        raise ProbeError(f"pod: must be 1..{MAX_POD_BYTES} bytes of UTF-8, got {quote(pod)}")
    return pod


def check_start_at(start_at: float, period_s: float, now: float | None = None) -> float:
    """`start_at` if bursts from it can be sent now or within MAX_START_AHEAD_S, numbered in a u32; else ProbeError."""
    now = time.time() if now is None else now
    if not math.isfinite(start_at) or not 0 <= start_at <= now + MAX_START_AHEAD_S:
        why = f"must be a UNIX time from 0 to {MAX_START_AHEAD_S // 86400} days from now"
        raise ProbeError(f"start_at (--start-at): {why}, got {quote(start_at)}")
    if (now - start_at) / period_s >= MAX_BURST:  # the burst field would overflow: nothing could be sent
        raise ProbeError(
            f"start_at (--start-at): more than {MAX_BURST} periods of {period_s:g} s ago, got {quote(start_at)}"
        )
    return start_at


# ---------------------------------------------------------------------------------------------- keys


def generate_key(path: Path) -> Path:
    """Write 32 random bytes to `path` (mode 0600) as a probe key; refuses to overwrite."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(os.urandom(KEY_BYTES))
    return path


def load_key(path: Path) -> bytes:
    """A probe key file's 32 bytes (ProbeError naming the file otherwise)."""
    try:
        with path.open("rb") as f:  # one byte past a key is enough to refuse it: /dev/zero is not read for ever
            key = f.read(KEY_BYTES + 1)
    except OSError as exc:
        raise ProbeError(f"key: cannot read {quote(str(path))}: {exc.strerror}") from None
    if len(key) != KEY_BYTES:
        raise ProbeError(f"key: {quote(str(path))} must hold exactly {KEY_BYTES} bytes (probe-agent keygen)")
    return key


# ------------------------------------------------------------------------------------- the datagram


@dataclass(frozen=True)
class Report:
    """What an agent says it sent in a burst: datagrams, payload bytes, first to last send (s)."""

    datagrams: int
    payload_bytes: int
    span_s: float

    def wire(self) -> int:
        """The burst's bytes on the wire."""
        return self.payload_bytes + self.datagrams * UDP_WIRE_OVERHEAD


@dataclass(frozen=True)
class ProbeDatagram:
    """One probe datagram's fields (the tag aside)."""

    pod: str
    burst: int
    seq: int
    sent: float
    previous: Report | None  # the burst before, as sent by this agent (None: it had not started)


def _tag(key: bytes, port: int, body: bytes) -> bytes:
    return hmac.new(key, PORT.pack(port) + body, hashlib.sha256).digest()


def encode(key: bytes, port: int, d: ProbeDatagram, size: int) -> bytes:
    """`d` as a datagram of `size` bytes to `port`, tagged under `key`."""
    name = d.pod.encode()
    prev = d.previous
    report = (NO_REPORT, 0, 0) if prev is None else (prev.datagrams, prev.payload_bytes, round(prev.span_s * 1e6))
    body = HEAD.pack(MAGIC, len(name)) + name + BODY.pack(d.burst, d.seq, d.sent, *report)
    if size < len(body) + TAG_BYTES:
        raise ProbeError(
            f"size: {size} bytes cannot hold a datagram of pod {quote(d.pod)} (at least {min_payload(d.pod)})"
        )
    body += bytes(size - len(body) - TAG_BYTES)
    return body + _tag(key, port, body)


def decode(key: bytes, port: int, data: bytes) -> ProbeDatagram | Rejection:
    """The datagram's fields if its tag verifies under `key` for `port`; else why not."""
    if len(data) < HEAD.size + BODY.size + TAG_BYTES + 1:
        return "malformed"
    magic, n = HEAD.unpack_from(data)
    if magic != MAGIC or not 1 <= n <= MAX_POD_BYTES or len(data) < HEAD.size + n + BODY.size + TAG_BYTES:
        return "malformed"
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if not hmac.compare_digest(_tag(key, port, body), tag):
        return "bad-mac"
    try:
        pod = data[HEAD.size : HEAD.size + n].decode()
    except UnicodeDecodeError:
        return "malformed"  # tagged by the key's holder, yet not a pod name: a broken agent
    burst, seq, sent, count, payload, span_us = BODY.unpack_from(data, HEAD.size + n)
    previous = None if count == NO_REPORT else Report(count, payload, span_us * 1e-6)
    return ProbeDatagram(pod, burst, seq, sent, previous)


# --------------------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class ProbeSchedule:
    """When bursts start (burst k at `first` + k x `period_s`), and which stamps can be true."""

    first: float
    period_s: float
    # How far the agent's clock may be ahead of the receiver's (0 in the lab, where both read one clock; a
    # site syncs its hosts and says how well, or stamps "after" their arrival are refused).
    skew_s: float = 0.0

    def burst_of(self, sent: float) -> int:
        """The burst a datagram stamped `sent` belongs to."""
        return math.floor((sent - self.first) / self.period_s)

    def start(self, burst: int) -> float:
        """When `burst` starts."""
        return self.first + burst * self.period_s

    def deadline(self, burst: int) -> float:
        """After this, nothing of `burst` is a straggler: the end of the period after it."""
        return self.first + (burst + 2) * self.period_s

    def refuse(self, sent: float, arrived: float, burst: int | None = None) -> Rejection | None:
        """Why a stamp `sent` arriving at `arrived` (in `burst`, if claimed) cannot be true; None if it can.

        Red team, 2026-12-03: a stamp that is not finite, after its arrival, or out of its burst would
        reopen an old burst, seed a future one or stop the audit; one that arrives more than a period
        after its burst is a replay, or nothing the judgement of its burst can still take."""
        if not (math.isfinite(sent) and self.first <= sent <= arrived + self.skew_s):
            return "implausible"
        # An honest agent stamps and numbers its bursts by one clock, its own: stamp and burst agree.
        k = self.burst_of(sent)
        if burst is not None and burst != k:
            return "implausible"
        if arrived >= self.deadline(k) + self.skew_s:
            return "stale"
        return None


def burst_plan(rate_bps: float, burst_s: float, size: int) -> tuple[int, float]:
    """How an agent sends a burst of `burst_s` at `rate_bps` (wire bytes): datagrams, and the gap between them."""
    gap = wire_bytes(size) * 8 / rate_bps
    return max(1, round(burst_s / gap)), gap


# ----------------------------------------------------------------------------------------- the agent


@dataclass(frozen=True)
class AgentConfig:
    """What a probe agent sends: whose, where, how fast, how long, when, under which key."""

    pod: str
    host: str
    port: int
    rate_bps: float
    burst_s: float
    period_s: float
    start_at: float
    size: int
    key: bytes = field(repr=False)
    duration_s: float | None = None  # after start_at; None: until stopped

    def __post_init__(self) -> None:
        check_pod(self.pod)
        for name in ("rate_bps", "burst_s", "period_s", "start_at"):
            value = getattr(self, name)
            if not math.isfinite(value) or (name != "start_at" and value <= 0):
                raise ProbeError(f"{name}: must be a finite number > 0, got {quote(value)}")
        if self.burst_s >= self.period_s:
            raise ProbeError(f"burst_s: {self.burst_s} must be shorter than period_s ({self.period_s})")
        check_start_at(self.start_at, self.period_s)
        if not 1 <= self.port <= 65535:
            raise ProbeError(f"port: must be 1..65535, got {quote(self.port)}")
        if not min_payload(self.pod) <= self.size <= MAX_UDP_PAYLOAD:
            raise ProbeError(f"size: must be {min_payload(self.pod)}..{MAX_UDP_PAYLOAD} bytes, got {quote(self.size)}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ProbeError(f"duration_s: must be a finite number > 0, got {quote(self.duration_s)}")
        if len(self.key) != KEY_BYTES:
            raise ProbeError(f"key: must be {KEY_BYTES} bytes, got {len(self.key)}")


@dataclass
class AgentResult:
    """What an agent sent: bursts, datagrams, payload bytes, and send errors it counted."""

    bursts: int = 0
    datagrams: int = 0
    payload_bytes: int = 0
    send_errors: int = 0


def run_agent(cfg: AgentConfig, stop: threading.Event | None = None) -> AgentResult:
    """Send `cfg`'s bursts on its schedule until its duration ends or `stop` is set."""
    stop = stop or threading.Event()
    schedule = ProbeSchedule(cfg.start_at, cfg.period_s)
    per_burst, gap = burst_plan(cfg.rate_bps, cfg.burst_s, cfg.size)
    end = math.inf if cfg.duration_s is None else cfg.start_at + cfg.duration_s
    result = AgentResult()
    # An agent that starts late begins with the next whole burst: a burst it joined halfway through would
    # report less than the verifier's plan and look like loss.
    k = max(0, math.ceil((time.time() - cfg.start_at) / cfg.period_s))
    previous: Report | None = None
    family = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family[0], socket.SOCK_DGRAM) as sock:
        # Unconnected: an ICMP unreachable (a receiver not up yet) is no error to the next send.
        while schedule.start(k) < end and not stop.is_set():
            start, cut = schedule.start(k), schedule.start(k + 1)
            sent = payload = 0
            first_sent = last_sent = 0.0
            for seq in range(per_burst):
                if stop.wait(max(0.0, start + seq * gap - time.time())):
                    break
                now = time.time()
                if now >= cut:
                    break  # fell behind by a whole period: what is left would be stamped in the next burst
                data = encode(cfg.key, cfg.port, ProbeDatagram(cfg.pod, k, seq, now, previous), cfg.size)
                try:
                    sock.sendto(data, family[4])
                except OSError as exc:
                    if exc.errno not in _COUNTED_SEND_ERRORS:
                        raise
                    result.send_errors += 1
                    continue
                first_sent = first_sent or now
                last_sent = now
                sent, payload = sent + 1, payload + len(data)
            previous = Report(sent, payload, last_sent - first_sent)
            result.bursts += 1
            result.datagrams += sent
            result.payload_bytes += payload
            k += 1
    return result


# -------------------------------------------------------------------------------------- the receiver


@dataclass
class BurstSeen:
    """What a receiver took of one burst: datagrams, the highest seq, first and last send, last arrival."""

    datagrams: int
    max_seq: int
    payload: int  # one datagram's payload bytes (an agent sends them all alike)
    first_sent: float
    last_sent: float
    last_arrival: float


@dataclass
class ProbeReceiver:
    """Takes one pod's probe datagrams on one port: authenticated, de-duplicated, plausible (the module's docstring)."""

    pod: str
    key: bytes = field(repr=False)
    port: int
    schedule: ProbeSchedule
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> datagrams refused
    reports: dict[int, Report] = field(default_factory=dict)  # burst -> what the agent says it sent in it
    seen: dict[int, BurstSeen] = field(default_factory=dict)  # burst -> what was taken of it
    fresh: set[int] = field(default_factory=set)  # bursts an agent (re)started with (it reported no burst before)
    # burst -> seqs taken (forgotten once the burst's deadline has passed: older ones are stale anyway)
    _taken: dict[int, set[int]] = field(default_factory=dict)

    def accept(self, data: bytes, arrived: float) -> ProbeDatagram | Rejection:
        """The datagram if it is taken; else the reason, counted in `rejected`."""
        d = decode(self.key, self.port, data)
        if not isinstance(d, ProbeDatagram):
            pass
        elif d.pod != self.pod:
            d = "other-pod"
        elif why := self.schedule.refuse(d.sent, arrived, d.burst):
            d = why
        elif d.seq in self._taken.setdefault(d.burst, set()):
            d = "replay"
        if not isinstance(d, ProbeDatagram):
            self.rejected[d] += 1
            return d
        self._taken[d.burst].add(d.seq)
        for old in [k for k in self._taken if self.schedule.deadline(k) <= arrived]:
            del self._taken[old]
        if d.previous is None:
            self.fresh.add(d.burst)
        elif d.burst > 0:
            self.reports.setdefault(d.burst - 1, d.previous)
        b = self.seen.get(d.burst)
        if b is None:
            self.seen[d.burst] = BurstSeen(1, d.seq, len(data), d.sent, d.sent, arrived)
        else:
            b.datagrams, b.max_seq = b.datagrams + 1, max(b.max_seq, d.seq)
            b.first_sent, b.last_sent = min(b.first_sent, d.sent), max(b.last_sent, d.sent)
            b.last_arrival = max(b.last_arrival, arrived)
        return d

    def sent_in(self, burst: int, boundary: float, planned: Report) -> Report | None:
        """What the agent sent in `burst`, as far as can be told by `boundary` (None: not yet).

        Its own report (carried by the next burst) when it came; else, once the next burst's stragglers are
        all in, the least its datagrams show (as many as its highest seq); a burst of which nothing came:
        nothing if the next burst heard is one an agent (re)started with (it was not running), else `planned`
        once GRACE_BURSTS more have had their time (every probe lost, or an agent that stopped)."""
        if (report := self.reports.get(burst)) is not None:
            return report
        b = self.seen.get(burst)
        if b is not None:
            if self.schedule.deadline(burst + 1) > boundary:
                return None
            n = b.max_seq + 1
            return Report(n, n * b.payload, b.last_sent - b.first_sent)
        later = [k for k in self.seen if k > burst]
        if later and min(later) in self.fresh:
            return Report(0, 0, 0.0)
        return planned if self.schedule.deadline(burst + GRACE_BURSTS) <= boundary else None


# A burst of which nothing arrived is judged this many periods after its own deadline: time for an agent
# that started late (or restarted) to say so.
GRACE_BURSTS = 3


@dataclass(frozen=True)
class BurstClose:
    """A burst whose every straggler is in, for the under-delivery check: what the agent sent in it (its own
    report, authenticated; else the verifier's plan), over how long, and when its bytes crossed the router
    (in the audit's time)."""

    sent_bytes: int
    send_s: float
    span: tuple[float, float]


class BurstBook(Protocol):
    """A probe's bookkeeping as the audit keeps it (checks.Probe): bytes, allowance and close per burst."""

    bursts: dict[int, int]
    allowances: dict[int, int]
    closed: dict[int, BurstClose]


# A datagram taken, waiting to be counted: (sent, probe's key, wire bytes, arrived).
Pending = tuple[float, int, int, float]


def arrival_allowance(
    arrivals: list[tuple[float, int]], start: float, probe_s: float, allowed: Callable[[float], int]
) -> int:
    """What a burst that arrived as `arrivals` (time, wire bytes) may hold, `allowed(s)` being the cap's
    allowance over s seconds: the cap over the time it took to get through (a loaded target passes it more
    slowly than it was sent: a clean run's one alarm, 4,374 B over), but judged along its arrival curve from
    the burst's start, not only whole, so that a burst passed at line rate with one datagram held back does
    not buy the longer time (red team: 997,864 B within 0.5 s against 607,590)."""
    arrivals.sort()
    origin = max(start, arrivals[0][0])
    total = sum(w for _, w in arrivals)
    # As an allowance for the whole: the total, less the most any prefix went over the cap over its time
    # (never less than the burst was sent over). The last prefix is the whole burst.
    excess, so_far = -math.inf, 0
    for t, w in arrivals:
        so_far += w
        excess = max(excess, so_far - allowed(max(probe_s, t - origin)))
    return int(total - excess)


def count_bursts(
    pending: Iterable[Pending],
    boundary: float,
    schedule: ProbeSchedule,
    probes: Mapping[int, BurstBook],
    arrivals: dict[tuple[int, int], list[tuple[float, int]]],
    allowed: Callable[[int, float], int],
    probe_s: float,
) -> list[Pending]:
    """Count every datagram sent before `boundary` against its probe's burst (and that burst's allowance
    along its arrival curve); returns those sent since, for later. Stamps that cannot be true are dropped."""
    keep: list[Pending] = []
    touched: set[tuple[int, int]] = set()
    for sent, key, wire, arrived in pending:
        why = schedule.refuse(sent, arrived)
        if why == "implausible":
            continue
        if sent >= boundary:
            keep.append((sent, key, wire, arrived))
            continue
        if why == "stale":
            continue  # arrived more than a period after its burst: not a straggler of it
        k = schedule.burst_of(sent)
        probe = probes[key]
        probe.bursts[k] = probe.bursts.get(k, 0) + wire
        arrivals.setdefault((key, k), []).append((arrived, wire))
        touched.add((key, k))
    for key, k in touched:
        probes[key].allowances[k] = arrival_allowance(
            arrivals[(key, k)], schedule.start(k), probe_s, functools.partial(allowed, key)
        )
    ended = round((boundary - schedule.first) / schedule.period_s) - 1
    if ended >= 0:
        for probe in probes.values():
            probe.bursts.setdefault(ended, 0)  # the burst that just ended is judged even if none of it arrived
    return keep


# Router bytes of a burst are taken this long past its last send or arrival: frames a DPU still queued.
SPAN_MARGIN_S = 0.2


def close_bursts(
    probe: BurstBook, rx: ProbeReceiver, boundary: float, planned: Report, audit_time: Callable[[float], float]
) -> None:
    """Hand the audit (`probe.closed`) each burst of `rx`, in order, once what its agent sent in it can be
    told (ProbeReceiver.sent_in) and its stragglers are all in by `boundary`."""
    k = max(probe.closed, default=-1) + 1
    while rx.schedule.deadline(k) <= boundary and (report := rx.sent_in(k, boundary, planned)) is not None:
        start = rx.schedule.start(k)
        b = rx.seen.get(k)
        last = max(start + report.span_s, b.last_arrival if b else start) + SPAN_MARGIN_S
        probe.closed[k] = BurstClose(report.wire(), report.span_s, (audit_time(start), audit_time(last)))
        k += 1


# ------------------------------------------------------------------------------------------ the sink


@dataclass
class ProbeSink:
    """The receiver's sockets: one per registered port, each datagram with the kernel's arrival time."""

    receivers: dict[int, ProbeReceiver] = field(default_factory=dict)  # port -> its pod's receiver
    socks: dict[int, socket.socket] = field(default_factory=dict)
    _buf: bytearray = field(default_factory=lambda: bytearray(65536))

    def listen(self, sock: socket.socket, host: str, rx: ProbeReceiver) -> None:
        """Bind `sock` (made in whatever namespace the caller chose) to `host`:`rx.port` for `rx`."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind((host, rx.port))
        sock.setblocking(False)
        self.receivers[rx.port], self.socks[rx.port] = rx, sock

    def drain(self) -> list[Pending]:
        """Every datagram waiting on the sockets, offered to its port's receiver: those taken, as Pending."""
        out: list[Pending] = []
        for port, sock in self.socks.items():
            rx = self.receivers[port]
            while True:
                try:
                    n, ancillary, _, _ = sock.recvmsg_into([self._buf], socket.CMSG_SPACE(TIMESPEC.size))
                except (BlockingIOError, InterruptedError):
                    break
                arrived = time.time()
                for level, kind, data in ancillary:
                    if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                        sec, nsec = TIMESPEC.unpack_from(data)
                        arrived = sec + nsec * 1e-9
                d = rx.accept(bytes(self._buf[:n]), arrived)
                if isinstance(d, ProbeDatagram):
                    out.append((d.sent, port, wire_bytes(n), arrived))
        return out

    def close(self) -> None:
        """Close every socket."""
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()
