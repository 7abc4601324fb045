"""Rate and burst conversions, in one place: bit/s at every user-facing edge, data-plane units below.

The chain for a byte meter on bmv2 (and on the embedded target, which copies it):

    user rate (bit/s)  --/8-->  P4Runtime MeterConfig cir/pir (bytes/s, int64)
                       --PI: /1e6-->  bmv2 info_rate (bytes per microsecond, double)
    user burst (bytes) --> P4Runtime cburst/pburst (int64) --PI: uint32--> bmv2 burst_size

PI narrows bursts to 32 bits, and reads them back as signed 32-bit values, so a burst of 2 GiB or
more would wrap or read back wrong on bmv2: it is refused here instead. Rates are rounded to the
nearest byte per second (at most 4 bit/s off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# PI narrows bursts to 32 bits on the way in and reads them back as signed 32-bit: below 2**31 both
# ways are exact.
MAX_PI_BURST = (1 << 31) - 1
MIN_DEFAULT_BURST = 16 * 1024
# The largest frame the lab counts (Ethernet header, 1500-byte payload, one VLAN tag; no FCS): the
# one packet by which a receiver-side window may exceed its allowance (docs/design.md, cap semantics).
MAX_FRAME_BYTES = 1518
DEFAULT_BURST_SECONDS = 0.1
# Neighbour discovery's allowance per DPU and direction: well-formed ARP frames of at most 60 bytes
# (limiter.p4's ARP_MAX_FRAME) pass through a meter of their own at this rate and burst, carved out
# of the cap: about 16 frames a second, 10 at once, whatever the data traffic does.
ARP_RATE_BPS = 8_000.0
ARP_BURST_BYTES = 600
# Default lease lifetime: a DPU out of touch with the control plane this long falls to its floor.
DEFAULT_LEASE_S = 30.0
# Replicas (replicas.py): a replica's lease in the database, renewed every sixth of it (a dead replica's DPUs
# move after at most this long, well within a third of a DPU's lease), and how often each reads the live
# replicas and the change log's head.
REPLICA_LEASE_S = 6.0
BACKUP_STREAMS = 1  # replicas after each pod's holder that keep backup streams to its DPUs (the next in line)
POLL_S = 0.2
# A replica whose database session ended (killed, or its connection dropped) keeps this much of its lease:
# alive, it takes a new session and renews within it (a poll or a few); dead, the others take its DPUs then.
SESSION_GRACE_S = 2.0
# How much slower than the control plane's a DPU's clock may run (a crystal's tolerance, with room):
# a lease's deadline on the DPU's clock is placed this much early, so that it never ends later than
# the control plane counts on.
MAX_CLOCK_DRIFT = 1e-4
ECHO_TIMEOUT_S = 5.0  # how long an agent waits for its DPU's clock echo
CPU_PORT = 510  # the limiter's CPU port (limiter.p4): PacketOuts enter, PacketIns leave there
PIPELINE_CHECK_S = 60.0  # seconds between checks of each DPU's pipeline (hash of P4Info and program)
MAX_STATUS_WAIT_S = 3600.0  # the longest GetStatus waits for a generation to be applied (wait_s)
# While a call is open (a GetStatus wait sends nothing for up to an hour), the API server pings its client this
# often: a proxy or NAT that drops idle connections keeps it, and a client gone without a word is found (its
# wait ends) after one more KEEPALIVE_TIMEOUT_S.
API_KEEPALIVE_S = 30.0
KEEPALIVE_TIMEOUT_S = 20.0
RESYNC_S = 5.0  # seconds between read-backs of each DPU against desired state (drift correction)
MAX_INSTALLS = 16  # pipelines pushed at once (each sends the whole device config, which the DPU loads)
# Largest API message either way: a fleet's Apply (10,000 pods, 20,000 DPUs) and its answer are
# about 6 MB, over gRPC's default receive limit of 4 MB.
MAX_MESSAGE_BYTES = 64 * 2**20
GRPC_MESSAGE_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
MAX_RECONCILES = 256  # DPUs reconciled at once (a batched Write and a Read each)
# P4Runtime connection attempts (each ~0.45 ms of the event loop's time): at most this many per second on
# average, this many at once (pacing.py). 20,000 DPUs connect in 20 s (within a default lease) with about
# half the loop, where opening them back to back took all of it for ~10 s.
CONNECTS_PER_S = 1000.0
CONNECT_BURST = 256


class UnitError(ValueError):
    """A rate or burst the data plane cannot represent; the message names the field and value."""


@dataclass(frozen=True)
class MeterParams:
    """A two-rate three-colour meter's P4Runtime configuration (bytes/s and bytes)."""

    cir: int
    cburst: int
    pir: int
    pburst: int


def bps_to_bytes_per_s(rate_bps: float, field: str = "rate_bps") -> int:
    """Bit/s to P4Runtime's bytes/s for a byte meter (rounded to nearest)."""
    if not math.isfinite(rate_bps) or rate_bps < 0:
        raise UnitError(f"{field}: must be a finite rate >= 0 bit/s, got {rate_bps!r}")
    value = round(rate_bps / 8)
    if value > (1 << 63) - 1:
        raise UnitError(f"{field}: {rate_bps!r} bit/s does not fit P4Runtime's int64 bytes/s")
    return value


def bytes_per_s_to_bmv2_rate(bytes_per_s: int) -> float:
    """P4Runtime bytes/s to bmv2's info_rate, bytes per microsecond (PI's conversion)."""
    return bytes_per_s / 1_000_000.0


def default_burst_bytes(rate_bps: float) -> int:
    """Default meter depth: 100 ms at the rate, at least 16 KiB (several full frames)."""
    return max(MIN_DEFAULT_BURST, math.ceil(rate_bps / 8 * DEFAULT_BURST_SECONDS))


def check_burst(burst_bytes: int, field: str = "burst_bytes") -> int:
    """Refuse bursts PI would truncate to 32 bits (and negative ones)."""
    if burst_bytes < 0 or burst_bytes > MAX_PI_BURST:
        raise UnitError(
            f"{field}: {burst_bytes!r} bytes is outside 0..{MAX_PI_BURST} (P4Runtime-to-bmv2 meter bursts are 32-bit)"
        )
    return burst_bytes


def cap_meter(rate_bps: float, burst_bytes: int, field: str = "rate_bps") -> MeterParams:
    """Meter parameters that drop (red) exactly what exceeds `rate_bps` with a `burst_bytes` bucket.

    Only red is dropped, so both buckets get the cap: CIR = PIR, CBS = PBS.
    """
    rate = bps_to_bytes_per_s(rate_bps, field)
    burst = check_burst(burst_bytes)
    return MeterParams(cir=rate, cburst=burst, pir=rate, pburst=burst)


def allowed_window_bytes(rate_bps: float, window_s: float, burst_bytes: int) -> int:
    """Most bytes a receiver may see in any window: rate x window, the bucket depth, and one frame.

    The frame is docs/design.md's allowance for where a window's edge cuts the packets it counts.
    """
    return math.floor(rate_bps / 8 * window_s) + burst_bytes + MAX_FRAME_BYTES


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def format_rate(rate_bps: float) -> str:
    """A rate in bit/s as parse_rate reads it back: 1e9 -> '1G', 2.5e6 -> '2.5M'."""
    for suffix, mult in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate_bps >= mult:
            return f"{rate_bps / mult:g}{suffix}"
    return f"{rate_bps:g}"


def parse_rate(text: str | float | int, field: str = "rate") -> float:
    """Parse a rate in bit/s: a number, or with a k/M/G/T suffix (optionally 'bit/s', 'bps')."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        if not s.isascii():  # float() takes any script's digits (Arabic-Indic, bold maths): a file means ASCII
            raise UnitError(f"{field}: cannot parse rate {text!r} (use ASCII digits, e.g. 20M, 1.5G, 1000000)")
        for unit in ("bit/s", "bps", "b/s", "bit"):
            if s.endswith(unit):
                s = s[: -len(unit)]
                break
        mult = _SUFFIX.get(s[-1:]) if s and s[-1].isalpha() else 1
        if mult is None:
            raise UnitError(f"{field}: cannot parse rate {text!r} (use e.g. 20M, 1.5G, 1000000)")
        try:
            value = float(s[:-1] if s and s[-1].isalpha() else s) * mult
        except ValueError:
            raise UnitError(f"{field}: cannot parse rate {text!r} (use e.g. 20M, 1.5G, 1000000)") from None
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"{field}: rate must be > 0 bit/s, got {text!r}")
    return value
