"""TCP in virtual time: a bulk sender (NewReno) and a receiver exchanging real TCP/IPv4 frames.

The sender counts its window in segments, as Linux does: slow start, congestion avoidance (one
segment per window of ACKs), fast retransmit on the third duplicate ACK and NewReno fast recovery
(RFC 6582: partial ACKs retransmit the next hole and stay in recovery), and a retransmission
timeout after RFC 6298 with Linux's 200 ms floor (initial RTO 1 s, doubled on each expiry; after
a timeout the sender goes back to the first unacknowledged segment; the backoff ends at the next
ACK of new data, as with TCP timestamps, Linux's default, which time resent segments too). The receiver acknowledges
every second segment (or 40 ms after a lone one, as Linux delays ACKs), at once when a segment is
out of order or fills a hole; it keeps out-of-order segments and advertises a fixed window (its
application reads at once). Not modelled: the handshake and FIN, SACK, RACK and tail-loss probes, pacing, quick-ACK
mode, ECN, CUBIC. All segments of a flow carry the same payload (MSS, or a large segment as
TSO/GRO would make); sequence numbers on the wire are real byte offsets, modulo 2**32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from .frames import SEQ_OFFSET, SPORT, tcp_frame
from .sim import Engine, SimNetwork, flow_mac

MSS = 1460
WINDOW_BYTES = 4 * 1024 * 1024  # the receiver's advertised window (Linux's rmem default is of this order)
MIN_RTO_NS = 200_000_000  # Linux's floor (RFC 6298 says 1 s)
INITIAL_RTO_NS = 1_000_000_000
MAX_RTO_NS = 60_000_000_000
INITIAL_CWND = 10  # segments (RFC 6928, Linux's default)
DELAYED_ACK_NS = 40_000_000  # Linux's minimum delayed-ACK timeout
WRAP = 1 << 32
HALF = 1 << 31
ACK_AT = SEQ_OFFSET + 4


def unwrap(wire: int, near: int, seg: int) -> int:
    """The segment index of wire sequence number `wire`, the one closest to index `near`."""
    diff = (wire - near * seg) % WRAP
    if diff >= HALF:
        diff -= WRAP
    return near + diff // seg


@dataclass(slots=True)
class TcpSender:
    """A bulk sender from `start_ns` to `end_ns` (then it stops: what is in flight still arrives)."""

    engine: Engine
    send: Callable[[bytes], None]
    template: bytes  # a data frame (tcp_frame) whose sequence number it patches in
    start_ns: int
    end_ns: int
    window_segments: int
    una: int = 0  # first unacknowledged segment
    nxt: int = 0  # next segment to send
    high: int = 0  # one past the highest segment ever sent: below it, a send is a retransmission
    cwnd: float = INITIAL_CWND
    ssthresh: float = float("inf")
    dupacks: int = 0
    recover: int = -1  # in fast recovery until this segment is acknowledged (-1: not in recovery)
    srtt_ns: float = 0.0
    rttvar_ns: float = 0.0
    rto_ns: int = INITIAL_RTO_NS
    rto_at: int = 0
    timer_pending: bool = False
    timed: int = -1  # the segment whose ACK gives the next RTT sample (-1: none; Karn's rule)
    timed_at: int = 0
    sent_segments: int = 0
    sent_wire_bytes: int = 0
    retransmissions: int = 0
    timeouts: int = 0
    fast_retransmits: int = 0
    _head: bytes = b""
    _tail: bytes = b""
    _seg: int = 0

    def start(self) -> None:
        """Schedule the first window."""
        self._head, self._tail = self.template[:SEQ_OFFSET], self.template[SEQ_OFFSET + 4 :]
        self._seg = len(self.template) - SEQ_OFFSET - 16  # the payload: after 38 bytes + 16 of TCP header
        self.engine.at(self.start_ns, self._fill)

    def _emit(self, idx: int) -> None:
        if idx < self.high:
            self.retransmissions += 1
        else:
            self.high = idx + 1
        frame = b"".join((self._head, ((idx * self._seg) % WRAP).to_bytes(4, "big"), self._tail))
        self.sent_segments += 1
        self.sent_wire_bytes += len(frame)
        self.send(frame)

    def _fill(self, _: object = None) -> None:
        """Send new segments while the window allows and the transfer lasts."""
        if self.engine.now_ns >= self.end_ns:
            return
        limit = self.una + min(int(self.cwnd), self.window_segments)
        nxt = self.nxt
        if nxt >= limit:
            return
        if self.timed < 0 and nxt >= self.high:  # Karn: time only a segment sent once
            self.timed, self.timed_at = nxt, self.engine.now_ns
        while nxt < limit:
            self._emit(nxt)
            nxt += 1
        self.nxt = nxt
        self._arm()

    def _arm(self) -> None:
        """Restart the retransmission timer (one pending event, moved lazily)."""
        self.rto_at = self.engine.now_ns + self.rto_ns
        if not self.timer_pending:
            self.timer_pending = True
            self.engine.at(self.rto_at, self._on_timer)

    def _on_timer(self, _: object = None) -> None:
        self.timer_pending = False
        now = self.engine.now_ns
        if self.una >= self.nxt or now >= self.end_ns:
            return  # nothing outstanding, or the flow is over
        if now < self.rto_at:
            self.timer_pending = True
            self.engine.at(self.rto_at, self._on_timer)
            return
        self.timeouts += 1
        self.ssthresh = max((self.nxt - self.una) / 2, 2)
        self.cwnd = 1
        self.recover = -1
        self.dupacks = 0
        self.timed = -1
        self.rto_ns = min(2 * self.rto_ns, MAX_RTO_NS)
        self.nxt = self.una  # go back: the receiver acknowledges what it already holds
        self._emit(self.una)
        self.nxt += 1
        self._arm()

    def on_ack(self, frame: bytes) -> None:
        """An ACK arrives: advance, count a duplicate, or recover."""
        if self.engine.now_ns >= self.end_ns:
            return  # the flow is over: what is in flight still arrives, nothing more is sent
        una = self.una
        ack = unwrap(int.from_bytes(frame[ACK_AT : ACK_AT + 4], "big"), una, self._seg)
        if ack > una:
            if self.timed >= 0 and ack > self.timed:
                self._sample(self.engine.now_ns - self.timed_at)
            elif self.srtt_ns:  # timestamps (Linux's default) time even a resent segment: the backoff ends
                self.rto_ns = max(MIN_RTO_NS, int(self.srtt_ns + 4 * self.rttvar_ns))
            newly = ack - una
            self.una = ack
            if self.nxt < ack:
                self.nxt = ack
            if self.recover >= 0:
                if ack >= self.recover:  # full ACK: recovery is over
                    self.cwnd = self.ssthresh
                    self.recover = -1
                else:  # partial ACK: the next hole is lost too
                    self.cwnd = max(self.cwnd - newly + 1, 1)
                    self._retransmit(ack)
            else:
                acked: float = newly
                if self.cwnd < self.ssthresh:  # slow start up to ssthresh, as Linux: a jump after a go-back
                    grow = min(acked, self.ssthresh - self.cwnd)  # must not become one huge burst
                    self.cwnd += grow
                    acked -= grow
                if acked > 0:
                    self.cwnd += acked / self.cwnd
            self.dupacks = 0
            if ack < self.nxt:
                self._arm()
        elif ack == una and una < self.nxt:
            self.dupacks += 1
            if self.recover >= 0:
                self.cwnd += 1  # each duplicate is a segment that left the network
            elif self.dupacks == 3:
                self.fast_retransmits += 1
                self.ssthresh = max((self.nxt - una) / 2, 2)
                self.cwnd = self.ssthresh + 3
                self.recover = self.nxt
                self._retransmit(una)
        self._fill()

    def _retransmit(self, idx: int) -> None:
        self.timed = -1  # Karn: no sample from a segment sent twice
        self._emit(idx)
        self._arm()

    def _sample(self, rtt: int) -> None:
        """RFC 6298's smoothed RTT and variation, and the RTO from them."""
        if self.srtt_ns == 0:
            self.srtt_ns, self.rttvar_ns = float(rtt), rtt / 2
        else:
            self.rttvar_ns = 0.75 * self.rttvar_ns + 0.25 * abs(self.srtt_ns - rtt)
            self.srtt_ns = 0.875 * self.srtt_ns + 0.125 * rtt
        self.rto_ns = max(MIN_RTO_NS, int(self.srtt_ns + 4 * self.rttvar_ns))
        self.timed = -1


@dataclass(slots=True)
class TcpReceiver:
    """Acknowledges cumulatively, every second in-order segment (or after DELAYED_ACK_NS), and at once
    when a segment is out of order or fills a hole; holds out-of-order segments; counts what it
    delivers in order."""

    engine: Engine
    send: Callable[[bytes], None]
    template: bytes  # an ACK frame (tcp_frame without payload) whose ack number it patches in
    segment_bytes: int
    rcv_nxt: int = 0  # next segment expected in order
    held: set[int] = field(default_factory=set)
    unacked: int = 0  # in-order segments received since the last ACK
    timer_pending: bool = False
    _head: bytes = b""
    _tail: bytes = b""

    def __post_init__(self) -> None:
        self._head, self._tail = self.template[:ACK_AT], self.template[ACK_AT + 4 :]

    @property
    def goodput_bytes(self) -> int:
        """Unique payload bytes delivered in order."""
        return self.rcv_nxt * self.segment_bytes

    def on_data(self, frame: bytes) -> None:
        """A data segment arrives: deliver what is now in order, and acknowledge (now or soon)."""
        nxt = self.rcv_nxt
        idx = unwrap(int.from_bytes(frame[SEQ_OFFSET : SEQ_OFFSET + 4], "big"), nxt, self.segment_bytes)
        held = self.held
        if idx == nxt and not held:
            self.rcv_nxt = nxt + 1
            self.unacked += 1
            if self.unacked >= 2:
                self._ack()
            elif not self.timer_pending:
                self.timer_pending = True
                self.engine.at(self.engine.now_ns + DELAYED_ACK_NS, self._on_timer)
            return
        if idx == nxt:  # fills a hole: deliver what it joins up
            nxt += 1
            while nxt in held:
                held.remove(nxt)
                nxt += 1
            self.rcv_nxt = nxt
        elif idx > nxt:
            held.add(idx)
        self._ack()  # out of order, a duplicate or a repair: the sender needs to know now

    def _on_timer(self, _: object = None) -> None:
        self.timer_pending = False
        if self.unacked:
            self._ack()

    def _ack(self) -> None:
        self.unacked = 0
        self.send(b"".join((self._head, ((self.rcv_nxt * self.segment_bytes) % WRAP).to_bytes(4, "big"), self._tail)))


def tcp_flow(
    net: SimNetwork, src: str, dst: str, port: int, start_ns: int, end_ns: int, mss: int = MSS
) -> tuple[TcpSender, TcpReceiver]:
    """A bulk TCP flow from `src` to `dst`'s `port`, started; data and ACKs carry the flow's port
    in their source MACs (or, within a pod, in their TCP ports), so both are attributed to the flow."""
    if mss < 1:
        raise ValueError(f"mss: {mss} must be at least 1 byte")
    topo = net.topology
    a, b = topo.address_of(src), topo.address_of(dst)
    src_mac, dst_mac = flow_mac(net, src, dst, port), flow_mac(net, dst, src, port)
    data = tcp_frame(a, b, SPORT, port, WINDOW_BYTES, mss, src_mac, net.mac_of[dst])
    ack = tcp_frame(b, a, port, SPORT, WINDOW_BYTES, 0, dst_mac, net.mac_of[src])
    window = max(WINDOW_BYTES // mss, 2)
    sender = TcpSender(net.engine, partial(net.send_from, src), data, start_ns, end_ns, window)
    receiver = TcpReceiver(net.engine, partial(net.send_from, dst), ack, mss)
    net.receivers[dst].endpoints[port] = receiver.on_data
    net.receivers[src].endpoints[port] = sender.on_ack
    sender.start()
    return sender, receiver
