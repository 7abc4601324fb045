"""Command line of the embedded target, started the way simple_switch_grpc is.

    dpu-softswitch --device-id 1 -i 0@veth0 -i 1@veth1 --no-p4 -- --grpc-server-addr 127.0.0.1:9559

The `--` that simple_switch_grpc needs before its target options is accepted and ignored, so
the lab builds one command line for either target. `--log-console` (with `--log-level`) prints
bmv2's kind of packet trace on stdout (dpu_softswitch.trace).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from finsy.proto import p4i, p4r
from google.protobuf import text_format

from .device import Device
from .firmware import serve as serve_firmware
from .ports import MAX_FRAME, RawPorts, parse_interface
from .server import add_to_server
from .switch.packet import DROP_PORT
from .trace import Tracer

LOG = logging.getLogger("dpu_softswitch")


def build_parser(prog: str = "dpu-softswitch") -> argparse.ArgumentParser:
    """The argument parser, shared with `dpu-limiter target`."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Embedded P4 target: runs compiled bmv2 JSON (v1model) and serves P4Runtime, "
        "with simple_switch_grpc's command line.",
    )
    ap.add_argument("json", nargs="?", help="bmv2 JSON to load at start (needs --p4info); omit with --no-p4")
    ap.add_argument(
        "-i",
        "--interface",
        action="append",
        default=[],
        metavar="PORT@IFNAME",
        help="attach port number PORT to interface IFNAME (repeatable)",
    )
    ap.add_argument("--device-id", type=int, default=0, help="P4Runtime device id (default 0, as bmv2)")
    ap.add_argument(
        "--grpc-server-addr", default="0.0.0.0:9559", help="P4Runtime listen address (default 0.0.0.0:9559)"
    )
    ap.add_argument("--no-p4", action="store_true", help="start with no pipeline; a controller sets it")
    ap.add_argument(
        "--max-frame-bytes",
        type=int,
        default=MAX_FRAME,
        metavar="N",
        help=f"drop received frames longer than N bytes, as a NIC does (64..{MAX_FRAME}; default {MAX_FRAME}: "
        "none, as simple_switch_grpc); a host's GSO frames reach a packet socket whole",
    )
    ap.add_argument(
        "--cpu-port",
        type=int,
        metavar="N",
        help="the CPU port for P4Runtime packet-in/packet-out (1..510, not a port given with -i); "
        "without it there is no packet I/O, as with simple_switch_grpc",
    )
    ap.add_argument("--grpc-server-ssl", action="store_true", help="serve P4Runtime over TLS")
    ap.add_argument("--grpc-server-cacert", type=Path, help="CA that client certificates must chain to")
    ap.add_argument("--grpc-server-cert", type=Path, help="server certificate (PEM)")
    ap.add_argument("--grpc-server-key", type=Path, help="server private key (PEM)")
    ap.add_argument(
        "--grpc-server-with-client-auth",
        action="store_true",
        help="require a client certificate signed by --grpc-server-cacert (mutual TLS)",
    )
    ap.add_argument("--p4info", type=Path, help="P4Info (text format) for a JSON given at start")
    ap.add_argument(
        "--firmware-socket",
        type=Path,
        help="also listen on this Unix socket for the device's own management path, apart from P4Runtime "
        "(dpu_softswitch.firmware: what compromised firmware could do; for the lab's attacks)",
    )
    ap.add_argument(
        "--log-console",
        action="store_true",
        help="log on stdout, as bmv2's option: the target's messages and, at log level debug or trace, "
        "a trace of every packet (parser states, tables, actions, conditions, meters, drop and egress)",
    )
    ap.add_argument(
        "-L",
        "--log-level",
        choices=list(LOG_LEVELS),
        help="bmv2's levels (trace, debug, info, warn, error, off; 'warning' is warn). With --log-console "
        "the default is trace, as bmv2's: debug traces each packet's path, trace adds primitives, conditions "
        "and bytes parsed. Without it the messages go to stderr (default warn) and no packet is traced",
    )
    return ap


# bmv2's log levels as Python logging levels (trace has none of its own; off is above every level).
LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 1,
}


def tracer_for(args: argparse.Namespace) -> Tracer | None:
    """The packet tracer the options ask for: --log-console at level trace (its default) or debug."""
    if not args.log_console:
        return None
    level = args.log_level or "trace"
    if level not in ("trace", "debug"):
        return None
    return Tracer(sys.stdout, detail=level == "trace", cpu_port=args.cpu_port)


def main(argv: Sequence[str] | None = None, prog: str = "dpu-softswitch") -> int:
    """Run the target until SIGINT/SIGTERM."""
    args_in = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--"]
    ap = build_parser(prog)
    args = ap.parse_args(args_in)
    # bmv2 logs nothing without a log sink; this target keeps its messages on stderr then, at warn.
    level = LOG_LEVELS[args.log_level or ("trace" if args.log_console else "warn")]
    stream = sys.stdout if args.log_console else sys.stderr
    # The level is this target's; the libraries under it (asyncio, gRPC) say warnings and worse only.
    logging.basicConfig(
        level=max(level, logging.WARNING), stream=stream, format="%(asctime)s dpu_softswitch %(levelname)s %(message)s"
    )
    logging.getLogger("dpu_softswitch").setLevel(level)
    try:
        interfaces = dict(parse_interface(spec) for spec in args.interface)
    except ValueError as exc:
        ap.error(str(exc))
    if args.grpc_server_ssl and not (args.grpc_server_cert and args.grpc_server_key):
        ap.error("--grpc-server-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_server_with_client_auth and not args.grpc_server_cacert:
        ap.error("--grpc-server-with-client-auth needs --grpc-server-cacert")
    if args.cpu_port is not None and not 0 < args.cpu_port < DROP_PORT:
        ap.error(f"--cpu-port {args.cpu_port}: must be within 1..{DROP_PORT - 1} (0 is not valid, {DROP_PORT} drops)")
    if not 64 <= args.max_frame_bytes <= MAX_FRAME:
        ap.error(f"--max-frame-bytes {args.max_frame_bytes}: must be within 64..{MAX_FRAME}")
    if args.cpu_port in interfaces:  # simple_switch_grpc refuses it too ("Cpu port N is used as a data port")
        ap.error(f"--cpu-port {args.cpu_port} is used as a data port (-i {args.cpu_port}@{interfaces[args.cpu_port]})")
    if args.json and not args.p4info:
        ap.error("a JSON given at start needs --p4info (or use --no-p4 and let the controller set the pipeline)")
    return asyncio.run(_serve(args, interfaces))


async def _serve(args: argparse.Namespace, interfaces: dict[int, str]) -> int:
    device = Device(args.device_id, cpu_port=args.cpu_port, trace=tracer_for(args))
    if args.json:
        config = p4r.ForwardingPipelineConfig(p4_device_config=Path(args.json).read_bytes())
        config.p4info.CopyFrom(text_format.Parse(args.p4info.read_text(), p4i.P4Info()))
        device.pipeline = device.build_pipeline(config)
    server = grpc.aio.server()
    add_to_server(server, device)
    try:
        if args.grpc_server_ssl:
            ca = args.grpc_server_cacert.read_bytes() if args.grpc_server_cacert else None
            creds = grpc.ssl_server_credentials(
                [(args.grpc_server_key.read_bytes(), args.grpc_server_cert.read_bytes())],
                root_certificates=ca,
                require_client_auth=args.grpc_server_with_client_auth,
            )
            server.add_secure_port(args.grpc_server_addr, creds)
        else:
            server.add_insecure_port(args.grpc_server_addr)
    except (RuntimeError, OSError) as exc:
        LOG.error("cannot listen on %s: %s", args.grpc_server_addr, exc)
        return 1
    ports = RawPorts(interfaces, args.max_frame_bytes) if interfaces else None
    await server.start()
    firmware = await serve_firmware(device, args.firmware_socket) if args.firmware_socket else None
    if ports is not None:
        device.inject = ports.inject
        ports.start(device.process)
    LOG.info("serving P4Runtime on %s, device id %d, ports %s", args.grpc_server_addr, args.device_id, interfaces)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if ports is not None:
        ports.close()
    if firmware is not None:
        firmware.close()
        args.firmware_socket.unlink(missing_ok=True)
    await server.stop(grace=0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
