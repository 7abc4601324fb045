"""Digests (v1model digest(), bmv2 learn lists) served over P4Runtime as simple_switch_grpc serves them.

Two layers, each as its source has it (behavioral-model 1.15, PI v0.1.1):

- bmv2's learn engine (src/bm_sim/learning.cpp), one buffer per learn list. At the end of ingress a
  packet whose last digest() named the list adds a sample, the bytes of the list's fields; a sample
  already in the buffer is dropped (bmv2's filter, which PI empties by acking each buffer as soon as
  it gets it, so it holds exactly what waits in the buffer). The buffer goes to PI when it holds
  max_samples, or `timeout` after its first sample. Before any DigestEntry that is 16 samples or 1 s
  (P4Objects::init_learn_lists); a DigestEntry sets max_samples to max_list_size (1024 for 0) and
  the timeout to max_timeout_ns in whole milliseconds (0: no timeout), and DELETE leaves both as
  they were (PI/src/pi_learn_imp.cpp).
- PI's DigestMgr (proto/frontend/src/digest_mgr.cpp), one per P4Info digest. Without a DigestEntry
  what bmv2 sends is dropped. With one, each sample becomes a P4Data (struct, tuple or bitstring
  members cut by P4Info's bit widths, canonical byte strings) in the DigestList being built; when
  ack_timeout_ns > 0, a sample already cached (sent in a list not yet acked nor expired) is
  dropped. The list is sent at once when max_timeout_ns is 0, or when it caches max_list_size
  samples (PI counts cached samples, so with ack_timeout_ns 0 only the timeout sends it); else a
  task every max(max_timeout_ns, 100 ms) sends it on its second run after it got data. Another task
  every max(ack_timeout_ns, 100 ms) expires a sent list's cache entries on its second run after
  the list was sent; a DigestListAck expires them at once. Both tasks start when the entry is
  written and run first one period later.

All times come from the pipeline's Clock, so the same holds in virtual time: whoever moves time
calls tick() (the gRPC server does it on wall-clock time; a simulation after advancing its clock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import grpc
from finsy.proto import p4d, p4i, p4r, p4t

from ..bytestrings import canonical
from ..errors import P4RuntimeError, ProgramError
from ..externs import Clock
from ..switch.loader import LearnListDef

Emit = Callable[[p4r.StreamMessageResponse], None]

BMV2_DEFAULT_SAMPLES = 16  # P4Objects::init_learn_lists
BMV2_DEFAULT_TIMEOUT_US = 1_000_000  # LearnEngineIface::list_create's default of 1000 ms
PI_MAX_SAMPLES_FOR_0 = 1024  # _pi_learn_config_set: max_list_size 0
PI_MIN_PERIOD_US = 100_000  # DigestMgr's min_max_timeout_ns and min_ack_timeout_ns (100 ms)


class _LearnBuffer:
    """bmv2's LearnList: the samples waiting to go to PI, and when they go."""

    def __init__(self, defn: LearnListDef) -> None:
        self.defn = defn
        self.nbytes = [(w + 7) // 8 for w in defn.widths]
        self.max_samples = BMV2_DEFAULT_SAMPLES
        self.timeout_us = BMV2_DEFAULT_TIMEOUT_US
        self.samples: list[bytes] = []
        self.waiting: set[bytes] = set()
        self.started_us = 0

    def sample(self, values: list[int]) -> bytes:
        """The sample's bytes: each field big-endian in whole bytes (bmv2's ByteContainer per field)."""
        return b"".join(v.to_bytes(n, "big") for v, n in zip(values, self.nbytes, strict=True))

    def add(self, sample: bytes, now: int) -> bool:
        """Buffer a sample unless it is already waiting; True when the buffer is now full."""
        if sample in self.waiting:
            return False
        self.samples.append(sample)
        self.waiting.add(sample)
        if len(self.samples) == 1:
            self.started_us = now
        return len(self.samples) >= self.max_samples

    def deadline(self) -> int | None:
        """When the buffer goes out on its timeout (None: not while it is empty or has no timeout)."""
        if self.samples and self.timeout_us > 0 and self.max_samples > 1:
            return self.started_us + self.timeout_us
        return None

    def take(self) -> list[bytes]:
        """Empty the buffer into a batch for PI (whose ack empties bmv2's filter with it)."""
        batch, self.samples = self.samples, []
        self.waiting.clear()
        return batch


@dataclass
class _Periodic:
    """One of PI's periodic digest tasks: its next run and period (microseconds)."""

    next_us: int
    period_us: int


@dataclass
class _SentList:
    """A sent DigestList's cached samples, and whether the ack-timeout task has seen it once."""

    cached: list[bytes]
    seen: bool = False


@dataclass
class _Digest:
    """PI's DigestData: one P4Info digest's config, cache and the DigestList being built."""

    digest_id: int
    learn_list: int  # the bmv2 learn list of the same name
    widths: list[int]
    kind: str  # which P4Data the samples become: "struct", "tuple" or "bitstring"
    config: p4r.DigestEntry | None = None
    cache: set[bytes] = field(default_factory=set)
    list_id: int = 1
    data: list[p4d.P4Data] = field(default_factory=list)
    cached: list[bytes] = field(default_factory=list)  # the current list's samples in the cache
    seen: bool = False  # the max-timeout task's timeout bit
    sent: dict[int, _SentList] = field(default_factory=dict)
    max_task: _Periodic | None = None
    ack_task: _Periodic | None = None

    def to_p4data(self, sample: bytes) -> p4d.P4Data:
        """The sample as P4Data, cut by the P4Info bit widths into canonical byte strings."""
        out = p4d.P4Data()
        if self.kind == "bitstring":
            out.bitstring = canonical(sample)
            return out
        members = out.struct.members if self.kind == "struct" else out.tuple.members
        off = 0
        for w in self.widths:
            n = (w + 7) // 8
            members.add().bitstring = canonical(sample[off : off + n])
            off += n
        return out


def _widths(spec: p4t.P4DataTypeSpec, info: p4t.P4TypeInfo, what: str) -> tuple[str, list[int]]:
    """(kind, member bit widths) of a digest's type, or PI's error for what it cannot send."""
    kind = spec.WhichOneof("type_spec")
    if kind == "bitstring":
        return kind, [_bitwidth(spec.bitstring, what)]
    if kind == "tuple":
        members = list(spec.tuple.members)
    elif kind == "struct":
        found = info.structs.get(spec.struct.name)
        if found is None:
            raise P4RuntimeError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: struct name '{spec.struct.name}' not found in P4TypeInfo struct map",
            )
        members = [m.type_spec for m in found.members]
    else:
        raise P4RuntimeError(
            grpc.StatusCode.UNIMPLEMENTED, f"{what}: packed type for digest can only be bitstring, struct or tuple"
        )
    widths = []
    for m in members:
        if m.WhichOneof("type_spec") != "bitstring":
            raise P4RuntimeError(
                grpc.StatusCode.UNIMPLEMENTED, f"{what}: {kind} can only include bitstring members for digests"
            )
        widths.append(_bitwidth(m.bitstring, what))
    return kind, widths


def _bitwidth(bs: p4t.P4BitstringLikeTypeSpec, what: str) -> int:
    which = bs.WhichOneof("type_spec")
    if which == "bit":
        return int(bs.bit.bitwidth)
    if which == "int":
        return int(bs.int.bitwidth)
    raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"{what}: varbits not supported for digests")


def _invalid(msg: str) -> P4RuntimeError:
    return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


class DigestEngine:
    """A pipeline's learn buffers and P4Runtime digests; thread-safe (packets and gRPC share it)."""

    def __init__(
        self,
        lists: dict[int, LearnListDef],
        p4info: p4i.P4Info,
        clock: Clock,
        emit: Emit,
        wake: Callable[[], None],
    ) -> None:
        self.clock = clock
        self._emit = emit
        self._wake = wake
        self._lock = threading.Lock()
        self.buffers = {lid: _LearnBuffer(defn) for lid, defn in lists.items()}
        by_name = {defn.name: lid for lid, defn in lists.items()}
        self.digests: dict[int, _Digest] = {}
        self._of_list: dict[int, _Digest] = {}  # learn list id -> its P4Info digest
        for d in p4info.digests:
            name = d.preamble.name
            kind, widths = _widths(d.type_spec, p4info.type_info, f"digest {name!r}")
            lid = by_name.get(name)
            if lid is None:
                raise ProgramError(f"P4Info digest {name!r} is not a learn list of the bmv2 JSON")
            want = sum(self.buffers[lid].nbytes)
            if sum((w + 7) // 8 for w in widths) != want:
                # simple_switch_grpc would drop every notification of this list ("unexpected digest size").
                raise ProgramError(f"P4Info digest {name!r}: its members do not make the learn list's {want} bytes")
            digest = _Digest(d.preamble.id, lid, widths, kind)
            self.digests[d.preamble.id] = digest
            self._of_list[lid] = digest
        self._deadline: int | None = None
        self._now = 0  # the time _run_due runs to

    # ---------------------------------------------------------------- packets and stream messages

    def learn(self, list_id: int, values: list[int]) -> None:
        """One sample of learn list `list_id` at the end of ingress (Program.on_learn)."""
        now = self.clock.now_us()
        with self._lock:
            self._run_due(now)
            buf = self.buffers[list_id]
            if buf.add(buf.sample(values), now):
                self._flush(list_id, now)
            self._rearm()

    def ack(self, ack: p4r.DigestListAck) -> None:
        """A DigestListAck: the list's samples leave the cache (unknown digests and lists are ignored)."""
        with self._lock:
            digest = self.digests.get(ack.digest_id)
            sent = digest.sent.pop(ack.list_id, None) if digest is not None else None
            if digest is not None and sent is not None:
                digest.cache.difference_update(sent.cached)

    def tick(self) -> None:
        """Run every timeout due by now."""
        now = self.clock.now_us()
        with self._lock:
            self._run_due(now)
            self._rearm()

    def next_deadline_us(self) -> int | None:
        """When tick() next has something to do (None: nothing is pending)."""
        with self._lock:
            return self._deadline

    # ---------------------------------------------------------------- DigestEntry

    def write(self, kind: int, entry: p4r.DigestEntry) -> None:
        """INSERT, MODIFY or DELETE a DigestEntry (raises P4RuntimeError with PI's codes)."""
        now = self.clock.now_us()
        with self._lock:
            self._run_due(now)
            digest = self._digest(entry.digest_id)
            self._set_config(digest, kind, entry)
            if kind == p4r.Update.DELETE:
                self._reset(digest)
            else:
                cfg = entry.config
                digest.max_task = self._periodic(cfg.max_timeout_ns, now)
                digest.ack_task = self._periodic(cfg.ack_timeout_ns, now)
                self._configure_bmv2(digest, cfg, now)
            self._rearm()

    def read(self, entry: p4r.DigestEntry) -> p4r.DigestEntry:
        """The DigestEntry as written."""
        if entry.digest_id == 0:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "digest_id must be set when reading DigestEntry")
        with self._lock:
            digest = self._digest(entry.digest_id)
            if digest.config is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"Digest {entry.digest_id} not configured")
            out = p4r.DigestEntry()
            out.CopyFrom(digest.config)
            return out

    def _digest(self, digest_id: int) -> _Digest:
        digest = self.digests.get(digest_id)
        if digest is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{digest_id} is not a valid digest id")
        return digest

    @staticmethod
    def _set_config(digest: _Digest, kind: int, entry: p4r.DigestEntry) -> None:
        if kind not in (p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE):
            raise _invalid("Invalid update type for DigestEntry")
        if kind == p4r.Update.INSERT and digest.config is not None:
            raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS, f"Digest {digest.digest_id} already configured")
        if kind != p4r.Update.INSERT and digest.config is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"Digest {digest.digest_id} not configured")
        if kind == p4r.Update.DELETE:
            return
        cfg = entry.config
        # PI passes negative values on to casts whose result is undefined; this target refuses them.
        for name in ("max_timeout_ns", "max_list_size", "ack_timeout_ns"):
            if getattr(cfg, name) < 0:
                raise _invalid(f"DigestEntry.config.{name}: {getattr(cfg, name)} is negative")
        digest.config = p4r.DigestEntry()
        digest.config.CopyFrom(entry)

    @staticmethod
    def _periodic(period_ns: int, now: int) -> _Periodic | None:
        if period_ns == 0:
            return None
        period = max(period_ns // 1000, PI_MIN_PERIOD_US)
        return _Periodic(now + period, period)

    def _configure_bmv2(self, digest: _Digest, cfg: p4r.DigestEntry.Config, now: int) -> None:
        lid = digest.learn_list
        buf = self.buffers[lid]
        buf.max_samples = cfg.max_list_size or PI_MAX_SAMPLES_FOR_0
        if buf.samples and len(buf.samples) >= buf.max_samples:  # LearnList::set_max_samples
            self._flush(lid, now)
        buf.timeout_us = int(cfg.max_timeout_ns / 1_000_000) * 1000

    def _reset(self, digest: _Digest) -> None:
        # DigestData::reset: every cached sample is forgotten and the list being built dropped.
        digest.config = None
        digest.cache.clear()
        digest.sent.clear()
        digest.data, digest.cached, digest.seen = [], [], False
        digest.max_task = digest.ack_task = None

    # ---------------------------------------------------------------- time

    def _flush(self, list_id: int, now: int) -> None:
        """bmv2 sends a learn buffer; PI takes its samples."""
        batch = self.buffers[list_id].take()
        digest = self._of_list.get(list_id)
        if digest is None or digest.config is None:  # not in the P4Info, or no DigestEntry: PI drops it
            return
        cfg = digest.config.config
        added = False
        for sample in batch:
            if cfg.ack_timeout_ns > 0:  # PI uses its cache only with an ack timeout
                if sample in digest.cache:
                    continue
                digest.cache.add(sample)
                digest.cached.append(sample)
            digest.data.append(digest.to_p4data(sample))
            added = True
        full = cfg.max_list_size != 0 and len(digest.cached) >= cfg.max_list_size
        if added and (full or cfg.max_timeout_ns == 0):
            self._send(digest, now)

    def _send(self, digest: _Digest, now: int) -> None:
        msg = p4r.StreamMessageResponse()
        out = msg.digest
        out.digest_id, out.list_id, out.timestamp = digest.digest_id, digest.list_id, now * 1000
        out.data.extend(digest.data)
        self._emit(msg)
        digest.seen = False
        if digest.cached:
            digest.sent[digest.list_id] = _SentList(digest.cached)
        digest.list_id += 1
        digest.data, digest.cached = [], []

    def _max_timeout(self, digest: _Digest, at: int) -> bool:
        """DigestData::send_digest_if_needed; False when it had nothing to do."""
        if not digest.data:
            return False
        if digest.seen:
            self._send(digest, at)
        else:
            digest.seen = True
        return True

    @staticmethod
    def _ack_timeout(digest: _Digest) -> bool:
        """DigestData::purge_cache_if_needed; False when it had nothing to do."""
        busy = bool(digest.sent)
        for list_id, sent in list(digest.sent.items()):
            if sent.seen:
                digest.cache.difference_update(sent.cached)
                del digest.sent[list_id]
            else:
                sent.seen = True
        return busy

    def _events(self) -> list[tuple[int, object, Callable[[int], None]]]:
        """Every pending timeout as (time, whose, what to run then)."""
        out: list[tuple[int, object, Callable[[int], None]]] = []
        for lid, buf in self.buffers.items():
            when = buf.deadline()
            if when is not None:
                out.append((when, buf, partial(self._flush, lid)))
        for d in self.digests.values():
            if d.max_task is not None:
                out.append((d.max_task.next_us, d.max_task, partial(self._run_task, d, d.max_task)))
            if d.ack_task is not None:
                out.append((d.ack_task.next_us, d.ack_task, partial(self._run_task, d, d.ack_task)))
        return out

    def _run_task(self, digest: _Digest, task: _Periodic, at: int) -> None:
        max_task = task is digest.max_task
        busy = self._max_timeout(digest, at) if max_task else self._ack_timeout(digest)
        task.next_us += task.period_us
        if not busy:
            # An idle task stays idle until a run that does something (a buffer's timeout, a task with
            # data or lists to look at) or time reaches now: skip its runs up to then rather than loop
            # through them (a virtual clock may jump far ahead).
            bound = min([self._now] + [when for when, whose, _ in self._events() if self._may_act(whose)])
            if task.next_us <= bound:
                task.next_us += ((bound - task.next_us) // task.period_us + 1) * task.period_us

    def _may_act(self, whose: object) -> bool:
        """Whether a pending timeout's owner could change anything when it runs."""
        for d in self.digests.values():
            if whose is d.max_task:
                return bool(d.data)
            if whose is d.ack_task:
                return bool(d.sent)
        return True  # a learn buffer's timeout sends samples

    def _run_due(self, now: int) -> None:
        """Run the timeouts due by `now` in time order."""
        self._now = now
        if self._deadline is None or self._deadline > now:
            return
        while events := self._events():
            when, _, run = min(events, key=lambda e: e[0])
            if when > now:
                break
            run(when)

    def _rearm(self) -> None:
        """Recompute the next deadline; wake the timer if it moved earlier."""
        deadline = min((when for when, _, _ in self._events()), default=None)
        earlier = deadline is not None and (self._deadline is None or deadline < self._deadline)
        self._deadline = deadline
        if earlier:
            self._wake()
