"""The verifier's commands, added to `dpu-limiter` (entry point group dpu_limiter.cli):

dpu-limiter evidence keygen KEY              an Ed25519 key pair: KEY (private, 0600) and KEY.pub
dpu-limiter evidence verify DIR --key PUB    check a bundle offline; names the first record that fails
dpu-limiter verify --config FILE             the verifier as a service
dpu-limiter probe-agent keygen KEY           a pod's probe key (32 random bytes, 0600)
dpu-limiter probe-agent run ...              send authenticated probe bursts from a pod (docs/probes.md)
dpu-limiter probe-sink ...                   receive one pod's probes, one JSON line per burst
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import probe_agent


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `evidence`, `verify`, `probe-agent` and `probe-sink` to dpu-limiter's subcommands."""
    ev = sub.add_parser("evidence", help="the verifier's signed evidence").add_subparsers(
        dest="evidence_cmd", required=True, metavar="EVIDENCE_COMMAND"
    )
    keygen = ev.add_parser("keygen", help="make the verifier's signing key pair (Ed25519, PEM)")
    keygen.add_argument("key", type=Path, help="private key file to write (its public key: KEY.pub)")
    keygen.set_defaults(handler=_keygen)
    verify = ev.add_parser(
        "verify",
        help="check an evidence bundle offline",
        description="Check every record's DSSE signature against the public key, the hash chain, that "
        "every window of every pod and direction is there from the bundle's open to its close, and that "
        "each verdict follows from its figures. Exit 0 when all hold; else 1, naming the first record "
        "that fails.",
    )
    verify.add_argument("bundle", type=Path, help="the bundle's directory")
    verify.add_argument("--key", type=Path, required=True, help="the verifier's public key (PEM)")
    verify.add_argument(
        "--allow-open", action="store_true", help="accept a bundle still being written (no close record yet)"
    )
    verify.add_argument(
        "--require-balance",
        action="store_true",
        help="refuse a bundle that does not declare its running balance (any signed since it existed does): "
        "a signer could otherwise leave it out",
    )
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(handler=_verify)
    service = sub.add_parser(
        "verify",
        help="run the verifier: routers' counters over SNMP, the checks, signed evidence, alerts",
        description="Every sample_s read the routers' octet counters over SNMP; every interval_s check the "
        "caps the control plane's API says are in force against them and against the DPUs' counters, sign "
        "the figures into an evidence bundle, log each alert and count it in Prometheus metrics. Stops on "
        "SIGTERM or SIGINT, closing the bundle.",
    )
    service.add_argument("--config", type=Path, required=True, help="the verifier's config (YAML)")
    service.set_defaults(handler=_serve)
    probe_agent.add_commands(sub)


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from .service import ConfigError, Verifier, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"dpu-limiter verify: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Verifier(config).run(stop)

    try:
        asyncio.run(run())
    except ConfigError as exc:  # a probe socket that cannot be bound
        print(f"dpu-limiter verify: {args.config}: {exc}", file=sys.stderr)
        return 2
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from .evidence import generate_key

    try:
        pub = generate_key(args.key)
    except OSError as exc:
        print(f"dpu-limiter evidence keygen: {exc}", file=sys.stderr)
        return 2
    print(f"private key {args.key} (keep it on the verifier), public key {pub} (give it to whoever checks)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .evidence import load_public_key, verify_bundle

    try:
        key = load_public_key(args.key)
    except (OSError, ValueError) as exc:
        print(f"dpu-limiter evidence verify: --key {args.key}: {exc}", file=sys.stderr)
        return 2
    result = verify_bundle(args.bundle, key, allow_open=args.allow_open, require_balance=args.require_balance)
    if args.json:
        print(json.dumps(result.__dict__, sort_keys=True))
    elif result.ok:
        state = "closed" if result.closed else "open (still being written)"
        counts = ", ".join(f"{n} {v}" for v, n in sorted(result.verdicts.items())) or "none"
        print(f"OK: {result.records} records, {state}; windows: {counts}")
    else:
        print(f"FAILED after {result.records} good records: {result.problem}")
    return 0 if result.ok else 1
