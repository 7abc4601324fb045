"""The probe agent's commands: `dpu-limiter probe-agent run|keygen` and `probe-sink`, also as
`python -m dpu_verifier.probe_agent run|keygen ...` on a pod's host (standard library and this package only).
What they send and how a receiver judges it: probes.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from dpu_limiter.units import UnitError, parse_rate

from .probes import (
    AgentConfig,
    ProbeError,
    ProbeReceiver,
    ProbeSchedule,
    ProbeSink,
    check_pod,
    check_start_at,
    generate_key,
    load_key,
    quote,
    run_agent,
    wire_bytes,
)

MAX_HOST_CHARS = 253  # a DNS name's most (RFC 1035); addresses are shorter


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (port 1..65535), got {quote(text)}")
    host = host.strip("[]")
    if len(host) > MAX_HOST_CHARS:  # no name or address is longer; the resolver would fail on it with a UnicodeError
        raise argparse.ArgumentTypeError(f"host: at most {MAX_HOST_CHARS} characters, got {quote(text)}")
    return host, int(port)


def _rate(text: str) -> float:
    try:
        return parse_rate(text)
    except UnitError:
        raise argparse.ArgumentTypeError(f"expected a rate in bit/s such as 16M or 2.5G, got {quote(text)}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {quote(text)}")
    return value


def _integer(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {quote(text)}")
    return int(text)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `probe-agent` (run, keygen) and `probe-sink` to a command's subcommands."""
    agent = sub.add_parser("probe-agent", help="the verifier's probe agent, placed in a pod").add_subparsers(
        dest="probe_cmd", required=True, metavar="PROBE_COMMAND"
    )
    keygen = agent.add_parser("keygen", help="make a probe key (32 random bytes, mode 0600), one per pod")
    keygen.add_argument("key", type=Path, help="key file to write (given to the pod's agent and to the verifier)")
    keygen.set_defaults(handler=_keygen)
    run = agent.add_parser(
        "run",
        help="send authenticated probe bursts",
        description="Send a burst of UDP datagrams at --rate (wire bytes) for --burst-s at the start of every "
        "--period-s from --start-at, each tagged with HMAC-SHA256 under --key (docs/probes.md). Stops after "
        "--duration or on SIGTERM/SIGINT; --out writes what it sent as JSON.",
    )
    run.add_argument("--pod", required=True, help="the pod this agent speaks for (1..63 bytes)")
    run.add_argument("--to", type=_host_port, required=True, metavar="HOST:PORT", help="the verifier's receiver")
    run.add_argument("--rate", type=_rate, required=True, help="rate during a burst, bit/s on the wire (16M, 1G)")
    run.add_argument("--burst-s", type=_number, required=True, help="how long each burst lasts")
    run.add_argument("--period-s", type=_number, required=True, help="from one burst's start to the next")
    run.add_argument("--start-at", type=_number, help="UNIX time burst 0 starts (default: the next whole second)")
    run.add_argument("--size", type=_integer, default=1400, help="UDP payload bytes per datagram (default 1400)")
    run.add_argument("--key", type=Path, required=True, help="the pod's probe key file (probe-agent keygen)")
    run.add_argument("--duration", type=_number, help="stop this many seconds after --start-at")
    run.add_argument("--out", type=Path, help="write what was sent here as JSON when stopping")
    run.set_defaults(handler=_run)
    sink = sub.add_parser(
        "probe-sink",
        help="receive one pod's probes and print each burst as it closes (JSON lines)",
        description="Take the pod's probe datagrams on --listen (HMAC, pod, replay and stamp checked; "
        "docs/probes.md) and print one JSON line per burst once its stragglers are all in: datagrams and "
        "wire bytes taken, what the agent says it sent, and the datagrams refused since, by reason.",
    )
    sink.add_argument("--listen", type=_host_port, required=True, metavar="HOST:PORT")
    sink.add_argument("--pod", required=True, help="the pod whose agent sends here")
    sink.add_argument("--key", type=Path, required=True, help="the pod's probe key file")
    sink.add_argument("--start-at", type=_number, required=True, help="the agent's --start-at")
    sink.add_argument("--period-s", type=_number, required=True, help="the agent's --period-s")
    sink.add_argument("--duration", type=_number, help="stop this many seconds after --start-at")
    sink.set_defaults(handler=_sink)


def _fail(command: str, exc: Exception) -> int:
    print(f"dpu-limiter {command}: {exc}", file=sys.stderr)
    return 2


def _keygen(args: argparse.Namespace) -> int:
    try:
        generate_key(args.key)
    except FileExistsError:
        return _fail("probe-agent keygen", ProbeError(f"key: {quote(str(args.key))} exists: not overwritten"))
    except OSError as exc:
        return _fail("probe-agent keygen", ProbeError(f"key: cannot write {quote(str(args.key))}: {exc.strerror}"))
    print(f"probe key {args.key}: give it to the pod's agent and to the verifier, to no one else")
    return 0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(*_: object) -> None:
        # Set from another thread: the handler runs in the main thread, which may hold the event's own lock
        # (inside Event.wait) when the signal comes, and setting it here would wait on that lock for ever.
        threading.Thread(target=stop.set, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def _run(args: argparse.Namespace) -> int:
    if args.out is not None:  # checked before sending: a run's record must not be lost at its end
        problem = _unwritable(args.out)
        if problem:
            return _fail("probe-agent run", ProbeError(f"out: {quote(str(args.out))}: {problem}"))
    try:
        cfg = AgentConfig(
            pod=args.pod,
            host=args.to[0],
            port=args.to[1],
            rate_bps=args.rate,
            burst_s=args.burst_s,
            period_s=args.period_s,
            start_at=args.start_at if args.start_at is not None else float(math.ceil(time.time() + 0.5)),
            size=args.size,
            key=load_key(args.key),
            duration_s=args.duration,
        )
        socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_DGRAM)
    except ProbeError as exc:
        return _fail("probe-agent run", exc)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode (an empty label)
        return _fail("probe-agent run", ProbeError(f"to: cannot resolve {quote(cfg.host)}: {quote(str(exc))}"))
    result = run_agent(cfg, _stop_on_signals())
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        try:
            tmp.write_text(json.dumps(asdict(result)) + "\n")
            os.replace(tmp, args.out)
        except OSError as exc:  # removed or filled since the check
            return _fail("probe-agent run", ProbeError(f"out: cannot write {quote(str(args.out))}: {exc.strerror}"))
    return 0


def _unwritable(out: Path) -> str:
    """Why `out` (and its .tmp beside it) cannot be written, or "" if it can."""
    parent = out.parent
    if out.is_dir():
        return "is a directory"
    if not parent.is_dir():
        return f"directory {quote(str(parent))} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {quote(str(parent))} is not writable"
    return ""


def _sink(args: argparse.Namespace) -> int:
    try:
        if not args.period_s > 0:
            raise ProbeError(f"period_s: must be > 0, got {quote(args.period_s)}")
        schedule = ProbeSchedule(check_start_at(args.start_at, args.period_s), args.period_s)
        rx = ProbeReceiver(check_pod(args.pod), load_key(args.key), args.listen[1], schedule)
        sink = ProbeSink()
        sink.listen(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), args.listen[0], rx)
    except ProbeError as exc:
        return _fail("probe-sink", exc)
    except (OSError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else quote(str(exc))
        return _fail("probe-sink", ProbeError(f"listen: cannot bind {quote(args.listen[0])}:{args.listen[1]}: {why}"))
    stop, end = _stop_on_signals(), math.inf if args.duration is None else args.start_at + args.duration
    k, refused = 0, 0
    try:
        while not stop.wait(0.05) and time.time() < end + 2 * args.period_s:
            sink.drain()
            while rx.schedule.deadline(k) <= time.time():
                b, report = rx.seen.get(k), rx.reports.get(k)
                total = sum(rx.rejected.values())
                line = {
                    "pod": rx.pod,
                    "burst": k,
                    "datagrams": b.datagrams if b else 0,
                    "wire_bytes": b.datagrams * wire_bytes(b.payload) if b else 0,
                    "agent_sent_wire_bytes": None if report is None else report.wire(),
                    "rejected": total - refused,
                    "rejected_by_reason": dict(rx.rejected),
                }
                print(json.dumps(line), flush=True)
                k, refused = k + 1, total
    finally:
        sink.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m dpu_verifier.probe_agent run|keygen ...` (as dpu-limiter probe-agent), for a pod's host."""
    parser = argparse.ArgumentParser(prog="python -m dpu_verifier.probe_agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_commands(sub)
    args = parser.parse_args(["probe-agent", *(argv if argv is not None else sys.argv[1:])])
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
