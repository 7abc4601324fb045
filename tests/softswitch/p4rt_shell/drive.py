"""Drive a P4Runtime server with p4runtime-shell's Python API and record what it reads back.

Runs with the interpreter of the p4runtime-shell venv (tests/softswitch/p4rt_shell/env.sh), not the
project's: p4runtime-shell needs protobuf<3.21. tests/softswitch/test_p4runtime_shell.py runs it as

    python drive.py --addr 127.0.0.1:9559 --device-id 1 --p4info limiter.p4info.txtpb \
        --json limiter.json --out result.json

It sets the pipeline, inserts one LimiterIngress.boundary entry, configures one cell of
LimiterIngress.boundary_meter, reads a LimiterIngress.class_counter cell, and writes every
read-back as JSON. On failure it names the step and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import p4runtime_sh.shell as sh

TABLE = "LimiterIngress.boundary"
ACTION = "LimiterIngress.cross"
MATCH_FIELD = "standard_metadata.ingress_port"
METER = "LimiterIngress.boundary_meter"
COUNTER = "LimiterIngress.class_counter"
T = TypeVar("T")
METER_CONFIG = {"cir": 2_500_000, "cburst": 250_000, "pir": 2_500_000, "pburst": 250_000}


class StepError(Exception):
    """A step of the drive failed; the message names the step."""


def _int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def describe_table_entry(entry: Any) -> dict[str, Any]:
    """A table entry read through the shell, as JSON: names resolved through the shell's P4Info."""
    msg = entry.msg()
    match: dict[str, Any] = {}
    match_bytes: dict[str, str] = {}  # as sent on the wire, to tell canonical from padded encodings
    for fm in msg.match:
        name = sh.context.get_mf_name(entry.name, fm.field_id)
        kind = fm.WhichOneof("field_match_type")
        if kind in ("exact", "optional"):
            match[name] = _int(getattr(fm, kind).value)
            match_bytes[name] = getattr(fm, kind).value.hex()
        else:  # not in this program's tables; kept readable rather than dropped
            match[name] = {"kind": kind, "text": str(getattr(fm, kind)).strip()}
    out: dict[str, Any] = {
        "table": entry.name,
        "match": match,
        "match_bytes": match_bytes,
        "priority": msg.priority,
        "is_default_action": msg.is_default_action,
        "action": None,
    }
    if msg.action.HasField("action"):
        action = msg.action.action
        action_name = sh.context.get_name_from_id(action.action_id)
        out["action"] = {
            "name": action_name,
            "params": {sh.context.get_param_name(action_name, p.param_id): _int(p.value) for p in action.params},
        }
    return out


def describe_meter_entry(entry: Any) -> dict[str, Any]:
    """A meter entry read through the shell, as JSON (config None when the server sent none)."""
    msg = entry.msg()
    config = None
    if msg.HasField("config"):
        config = {k: getattr(msg.config, k) for k in ("cir", "cburst", "pir", "pburst", "eburst")}
    return {"meter": entry.name, "index": msg.index.index, "config": config}


def describe_counter_entry(entry: Any) -> dict[str, Any]:
    """A counter entry read through the shell, as JSON (data None when the server sent none)."""
    msg = entry.msg()
    data = None
    if msg.HasField("data"):
        data = {"byte_count": msg.data.byte_count, "packet_count": msg.data.packet_count}
    return {"counter": entry.name, "index": msg.index.index, "data": data}


def run_step(name: str, fn: Callable[[], T]) -> T:
    """Run one step; turn any failure, including the shell's sys.exit, into a StepError naming it."""
    try:
        return fn()
    except SystemExit as exc:  # sh.setup logs the cause, then calls sys.exit(1)
        raise StepError(f"{name}: p4runtime-shell gave up (exit {exc.code}); see its log above") from exc
    except Exception as exc:
        raise StepError(f"{name}: {type(exc).__name__}: {exc}") from exc


def drive(args: argparse.Namespace) -> dict[str, Any]:
    """Run every step against the server and return the results."""
    config = sh.FwdPipeConfig(str(args.p4info), str(args.json))
    # verbose stays at its default (True): in p4runtime-shell 0.0.6 Options.verbose is an Enum alias of
    # Options.canonical_bytestrings (both `= bool`), so verbose=False would also make it send padded
    # byte strings instead of the canonical ones the interactive shell sends. It only prints to stdout.
    run_step(
        "setup (arbitration + SetForwardingPipelineConfig + GetForwardingPipelineConfig)",
        lambda: sh.setup(device_id=args.device_id, grpc_addr=args.addr, election_id=(0, 1), config=config),
    )
    try:

        def insert() -> None:
            te = sh.TableEntry(TABLE)(action=ACTION)
            te.match[MATCH_FIELD] = "0"
            te.action["port"] = "1"
            te.action["cell"] = "0"
            te.action["inside"] = "1"
            te.insert()

        run_step(f"insert into {TABLE}", insert)
        tables = run_step(f"read {TABLE}", lambda: [describe_table_entry(e) for e in sh.TableEntry(TABLE).read()])

        def modify_meter() -> None:
            m = sh.MeterEntry(METER)
            m.index = 0
            for key, value in METER_CONFIG.items():
                setattr(m, key, value)
            m.modify()

        run_step(f"modify {METER}[0]", modify_meter)
        meters = run_step(
            f"read {METER}[0]", lambda: [describe_meter_entry(e) for e in sh.MeterEntry(METER)(index=0).read()]
        )
        counters = run_step(
            f"read {COUNTER}[0]",
            lambda: [describe_counter_entry(e) for e in sh.CounterEntry(COUNTER)(index=0).read()],
        )
    except BaseException:
        with contextlib.suppress(Exception):  # keep the first failure, not a teardown one
            sh.teardown()
        raise
    run_step("teardown", sh.teardown)
    return {
        "p4runtime_shell_version": version("p4runtime-shell"),
        "table_entries": tables,
        "meter_config_written": METER_CONFIG,
        "meter_entries": meters,
        "counter_entries": counters,
    }


def main() -> int:
    """Parse arguments, drive the server, write --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", required=True, help="P4Runtime server, HOST:PORT")
    ap.add_argument("--device-id", type=int, required=True)
    ap.add_argument("--p4info", type=Path, required=True, help="P4Info, text format")
    ap.add_argument("--json", type=Path, required=True, help="bmv2 JSON (the p4_device_config)")
    ap.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="drive.py %(levelname)s %(message)s")
    for path in (args.p4info, args.json):
        if not path.is_file():
            print(f"drive.py: no such file: {path}", file=sys.stderr)
            return 1
    try:
        result = drive(args)
    except StepError as exc:
        print(f"drive.py: FAILED at {exc}", file=sys.stderr)
        if exc.__cause__ is not None and not isinstance(exc.__cause__, SystemExit):
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        sys.stderr.flush()
        # p4runtime-shell's stream thread is not a daemon: after a failed handshake nothing stops it,
        # and a normal exit would wait for it forever.
        os._exit(1)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"drive.py: OK, results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
