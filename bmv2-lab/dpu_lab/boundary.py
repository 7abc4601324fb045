"""The lab's compliance view: every frame on every link that crosses a pod boundary, per direction.

``python -m dpu_lab.boundary --taps TAPS.json --duration S --out F [--serve]`` (as root, in the root
namespace: it opens each tap's socket inside the tap's namespace).

The boundary links (netns.py) are each pod's link to the router, watched at the router's end
(``router_ports[pod]``: frames the router receives on it are the pod's egress, frames it sends on it the
pod's ingress as the router delivers it), and each scale-up link between hosts of two pods, watched in
the lab's own namespace in the middle of the link, as frames arrive there from either host (frames from
a are a's egress and b's ingress, and the other way round: no host holds those interfaces, so none can
send past them or take frames off them before they are counted). A pod-uplink limiter
sits on the pod's router link, and it meters the pod's ingress after the router has sent it: so the
frames each such limiter sends into its pod (its host-side port, in the root namespace) are counted too,
as what really entered the pod ("uplink"). An AF_PACKET socket per link and direction (a direction
nobody's count needs is not read) sees every frame, whatever it holds and whoever it names: IPv4 or any
other EtherType, forged addresses, a frame the router then drops. Nothing here classifies, so an evader
cannot hide from it the way it can from a classifier or from receivers that attribute frames by their
addresses (capture.py). Each frame adds its wire bytes (capture.FrameReader: Ethernet header included,
no FCS, a VLAN tag the kernel took out counted back, a GSO super-packet counted as its segments) to 1 ms
bins of every (pod, direction) it counts for, kept apart by kind of link ("router", "uplink" or
"scale-up").

The verdict (``verdict_kinds``): a pod's egress is what its router link received plus what left it over
scale-up links; its ingress is what its uplink limiters sent into it (with pod-uplink placement; with
node or router placement, what its router link delivered, since no limiter stands between the router
and the pod's switch) plus what came in over scale-up links. The router-link counts in both directions
are the router's own, which the audit checks (live_audit.py, audit.py).

A frame the kernel dropped because this reader fell behind is not counted, so the capture also says how
many bytes such frames can have held, per key (``Capture.lost_bytes``: each lost frame as large as any
Linux link lets one be, capture.LOST_FRAME_BOUND), and the verdict takes them as crossed in the busiest
window: a cap is called held only when it held with them (evaluate.py, report.Result).

With ``--serve``, each line on stdin asks for the totals so far: the process first reads every frame
already waiting in its sockets (so the answer covers every frame the kernel delivered before the
question), then answers one JSON line ``{"POD DIRECTION KIND": bytes}``. The live audit reads the
router's counts this way (live_audit.py). End of stdin, SIGTERM or the duration ends the capture: what
is left in the sockets is read, and the counts are written as a capture.Capture keyed
``"POD DIRECTION KIND"``.

Virtual time counts the same frames on the same links (sim.py) and hands the report the same keys.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from dpu_lab import capture
from dpu_lab.capture import (
    CAPTURE_BIN_S,
    Capture,
    FrameReader,
    count_and_write,
    load_capture,
    open_socket,
    to_capture,
)
from dpu_lab.processes import stop_processes
from dpu_lab.traffic import Timeline

if TYPE_CHECKING:
    from dpu_lab.netns import LabNetwork

Kind = Literal["router", "uplink", "scale-up"]
KINDS: tuple[Kind, ...] = get_args(Kind)
Direction = Literal["egress", "ingress"]
Series = tuple[float, float, list[int]]


def key(pod: str, direction: str, kind: str) -> str:
    """The capture key of one pod's direction over one kind of link."""
    return f"{pod} {direction} {kind}"


@dataclass(frozen=True)
class Tap:
    """One boundary link, at one end: where it is, and whose egress and ingress its frames are."""

    ns: str  # the namespace holding the interface ("": the capture's own, the root namespace)
    iface: str
    kind: Kind
    received: tuple[tuple[str, Direction], ...]  # (pod, direction) each frame arriving on it counts for
    sent: tuple[tuple[str, Direction], ...]  # and each frame it sends

    def keys(self, outgoing: bool) -> list[str]:
        """Capture keys a frame sent (``outgoing``) or received on this link counts for."""
        return [key(pod, d, self.kind) for pod, d in (self.sent if outgoing else self.received)]


def taps_of(net: LabNetwork) -> list[Tap]:
    """Every link of a built lab network that crosses a pod boundary."""
    topo = net.topology
    taps = [
        Tap(net.router_ns, port, "router", ((pod, "egress"),), ((pod, "ingress"),))
        for pod, port in net.router_ports.items()
    ]
    # What a pod-uplink limiter sends on its host-side port has entered the pod past it; what it receives
    # there is on its way out, and counted at the router.
    taps += [
        Tap("", lim.host_if, "uplink", (), ((lim.pod, "ingress"),)) for lim in net.limiters if lim.role == "pod-uplink"
    ]
    for k, link in enumerate(topo.scaleup_links):
        pod_a, pod_b = topo.pod_of_host(link.a).name, topo.pod_of_host(link.b).name
        if pod_a == pod_b:
            continue  # a scale-up link inside one pod crosses no boundary
        # Counted in the lab's own namespace between the two hosts (netns.LabNetwork._scaleup), as each frame
        # arrives from its sender's end: no host holds these interfaces. At the hosts' ends a sender could
        # skip the taps of outgoing frames (PACKET_QDISC_BYPASS: a red team crossed 15,000,000 B uncounted
        # that way) and a receiver those of incoming ones (XDP).
        for end, pod_from, pod_to in (("a", pod_a, pod_b), ("b", pod_b, pod_a)):
            received: tuple[tuple[str, Direction], ...] = ((pod_from, "egress"), (pod_to, "ingress"))
            taps.append(Tap(net.scaleup_wires[k], f"end{end}", "scale-up", received=received, sent=()))
    return taps


def load_taps(path: Path) -> list[Tap]:
    """Read a taps file written by ``write_taps``."""
    return [
        Tap(
            t["ns"],
            t["iface"],
            t["kind"],
            tuple((p, d) for p, d in t["received"]),
            tuple((p, d) for p, d in t["sent"]),
        )
        for t in json.loads(Path(path).read_text())
    ]


def write_taps(path: Path, taps: Iterable[Tap]) -> None:
    """Write the taps the capture process is to open."""
    Path(path).write_text(json.dumps([asdict(t) for t in taps]))


def verdict_kinds(direction: str, placement: str) -> tuple[Kind, ...]:
    """The kinds of link whose counts make a pod's direction for the verdict (the module's docstring)."""
    if direction == "ingress" and placement == "pod-uplink":
        return ("uplink", "scale-up")
    return ("router", "scale-up")


def series(cap: Capture, pod: str, direction: str, kinds: Sequence[str] = KINDS) -> list[Series]:
    """The boundary capture's series of one pod's direction, one per kind of link that has any."""
    return [cap.series(key(pod, direction, k)) for k in kinds if key(pod, direction, k) in cap.by_src]


def total_bytes(cap: Capture, pod: str, direction: str, kinds: Sequence[str] = KINDS) -> int:
    """Every byte the boundary capture counted for one pod's direction over the given kinds of link."""
    return sum(cap.total_bytes(key(pod, direction, k)) for k in kinds)


def lost_bytes(cap: Capture, pod: str, direction: str, kinds: Sequence[str] = KINDS) -> int:
    """The most bytes the frames the capture lost can have added to one pod's direction over those links."""
    return sum(cap.lost_bytes.get(key(pod, direction, k), 0) for k in kinds)


@dataclass
class TapReader:
    """One direction of one boundary link: its socket's reader and the keys its frames count for."""

    keys: list[str]
    reader: FrameReader
    frame_bound: int = capture.LOST_FRAME_BOUND  # the most wire bytes a frame it lost can have held


class Counter:
    """Counts the frames of a set of taps: a socket per direction of each, and per-key 1 ms timelines."""

    def __init__(self, taps: Sequence[Tap], rcvbuf: int = capture.RCVBUF_BYTES) -> None:
        from dpu_lab.netns import entered  # only the real-time capture enters namespaces

        self.readers: list[TapReader] = []
        for tap in taps:
            ways: tuple[tuple[capture.Way, list[str]], ...] = (("out", tap.keys(True)), ("in", tap.keys(False)))
            for way, keys in ways:
                if not keys:
                    continue  # nobody's direction: its frames are not even queued
                with entered(tap.ns) if tap.ns else contextlib.nullcontext():
                    # An AF_PACKET socket stays in the namespace it was made in.
                    sock = open_socket(tap.iface, way, rcvbuf)
                self.readers.append(TapReader(keys, FrameReader(sock)))
        self.timelines: dict[str, Timeline] = {}
        self.totals: dict[str, int] = {}
        self.started = time.time()

    def drain(self, readers: Iterable[TapReader] | None = None, final: bool = False) -> None:
        """Count every frame waiting in the sockets (of ``readers``, else all) that the kernel stamped before
        now; with ``final``, every frame waiting at all."""
        timelines, totals = self.timelines, self.totals
        # Frames that keep coming while it reads would keep a drain going (and the other sockets waiting).
        until = math.inf if final else time.time()
        for r in self.readers if readers is None else readers:
            for f in r.reader.frames(None):
                r.frame_bound = max(r.frame_bound, f.wire)  # were one larger, lost ones could be too
                for k in r.keys:
                    tl = timelines.get(k)
                    if tl is None:
                        tl = timelines[k] = Timeline(CAPTURE_BIN_S)
                    tl.add(f.stamp, f.wire)
                    totals[k] = totals.get(k, 0) + f.wire
                if f.stamp > until:
                    break

    def result(self) -> Capture:
        """The counts as a capture (keys ``"POD DIRECTION KIND"``), with what lost frames can have held."""
        drops = sum(r.reader.drops for r in self.readers)
        stamps = "kernel" if all(r.reader.kernel_stamps for r in self.readers) else "user"
        out = to_capture("boundary", self.started, self.timelines, drops, stamps)
        for r in self.readers:
            if r.reader.drops:
                for k in r.keys:
                    out.lost_bytes[k] = out.lost_bytes.get(k, 0) + r.reader.drops * r.frame_bound
        return out

    def close(self) -> None:
        """Close the sockets."""
        for r in self.readers:
            r.reader.sock.close()


def run(taps: Sequence[Tap], deadline: float, serve: bool) -> Capture:
    """Count until monotonic ``deadline``, SIGTERM or (``serve``) the end of stdin; answer totals requests."""
    counter = Counter(taps)
    by_fd = {r.reader.sock.fileno(): r for r in counter.readers}
    watch = [*by_fd, 0] if serve else list(by_fd)
    try:
        while not capture._stop_requested and (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(watch, [], [], min(remaining, 0.1))
            counter.drain(by_fd[fd] for fd in ready if fd in by_fd)
            if 0 in ready:
                asked = os.read(0, 4096)
                if not asked:
                    break  # the runner is done (or gone)
                counter.drain()
                reply = (json.dumps(counter.totals) + "\n").encode()
                for _ in range(asked.count(b"\n")):
                    os.write(1, reply)
        counter.drain(final=True)
        return counter.result()
    finally:
        counter.close()


class BoundaryProcess:
    """The boundary capture as a run drives it: asked for its totals while it runs, then ended."""

    def __init__(self, popen: subprocess.Popen[bytes], out: Path) -> None:
        self.popen = popen
        self.out = out
        self._lock = threading.Lock()

    def totals(self, timeout_s: float = 10.0) -> dict[str, int]:
        """Bytes counted per key so far, every frame the kernel had delivered by now included."""
        stdin, stdout = self.popen.stdin, self.popen.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            stdin.write(b"?\n")
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], timeout_s)
            if not ready:
                raise RuntimeError(f"the boundary capture did not answer within {timeout_s:g} s")
            line = stdout.readline()
        if not line:
            raise RuntimeError(f"the boundary capture ended early (exit {self.popen.poll()})")
        return {str(k): int(v) for k, v in json.loads(line).items()}

    def router_totals(self) -> dict[tuple[str, str], int]:
        """Bytes on the pods' router links so far per (pod, direction): the router's own count."""
        out: dict[tuple[str, str], int] = {}
        for k, n in self.totals().items():
            pod, direction, kind = k.rsplit(" ", 2)
            if kind == "router":
                out[(pod, direction)] = out.get((pod, direction), 0) + n
        return out

    def finish(self, timeout_s: float = 30.0) -> Capture:
        """End the capture (end of its stdin) and read what it wrote."""
        with self._lock:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_processes(self.popen, timeout=10)  # SIGTERM still makes it write its counts
        if self.popen.returncode != 0:
            log = self.out.with_suffix(".log")
            raise RuntimeError(f"the boundary capture failed (exit {self.popen.returncode}); see {log}")
        return load_capture(self.out)


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.boundary", description=__doc__.splitlines()[0])
    parser.add_argument("--taps", type=Path, required=True, help="JSON file of the links to watch (write_taps)")
    parser.add_argument("--duration", type=float, required=True, help="seconds to capture at most")
    parser.add_argument("--out", type=Path, required=True, help="JSON result file to write")
    parser.add_argument("--serve", action="store_true", help="answer a totals request per line on stdin")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.duration > 0:
        parser.error("--duration must be > 0")
    taps, deadline = load_taps(args.taps), time.monotonic() + args.duration
    return count_and_write("boundary capture", args.out, lambda: run(taps, deadline, args.serve))


if __name__ == "__main__":
    sys.exit(main())
