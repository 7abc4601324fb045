"""`dpu-limiter`: the command line for operators, researchers and CI.

dpu-limiter lab run SCENARIO --out DIR [--target embedded|bmv2]     (with the lab installed: dpu_lab.cli)
dpu-limiter serve [--db PATH] [--listen ADDR]
dpu-limiter target -i 0@IF0 -i 1@IF1 --device-id N --no-p4 -- --grpc-server-addr ADDR   (dpu_softswitch.main)
dpu-limiter cap set POD --egress 1G --ingress 1G --window 60 [--burst BYTES]
dpu-limiter cap get POD | usage [--pod POD] | status        (with --server ADDR)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from .client import LimiterClient
    from .manifest import Manifest

from . import display
from .units import (
    BACKUP_STREAMS,
    DEFAULT_LEASE_S,
    MAX_INSTALLS,
    MAX_RECONCILES,
    MAX_STATUS_WAIT_S,
    PIPELINE_CHECK_S,
    REPLICA_LEASE_S,
    RESYNC_S,
)

DEFAULT_SERVER = "127.0.0.1:50100"
# Commands of other packages (the lab's `lab`): each entry point of this group names a function that
# takes the subcommands (argparse's add_subparsers()) and adds its own, each with
# `set_defaults(handler=FUNCTION)`: FUNCTION(args) runs the command and returns its exit status. It
# imports only what building its parsers needs; what the commands run, it imports when they run. A
# command with options of its own (the embedded target's, simple_switch_grpc's) sets
# `set_defaults(raw=FUNCTION)` instead: FUNCTION(argv, prog) gets the words after the command's name.
PLUGIN_GROUP = "dpu_limiter.cli"
Handler = Callable[[argparse.Namespace], int]
RawHandler = Callable[[list[str], str], int]


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Let every installed package of PLUGIN_GROUP add its commands (in the order of their names); one
    that cannot be loaded is left out, saying so, and the others work."""
    for ep in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        try:
            add_commands = ep.load()
        except ImportError as exc:
            print(f"dpu-limiter: the commands of {ep.value} are not available: {exc}", file=sys.stderr)
            continue
        add_commands(sub)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser, and each command's parser by name."""
    ap = argparse.ArgumentParser(
        prog="dpu-limiter",
        description="Cap the bandwidth between accelerator pods "
        "with P4 data planes, and measure it in an emulation lab.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    _add_plugins(sub)  # the lab's `lab` (dpu_lab.cli), the embedded target's `target`, when installed

    serve = sub.add_parser("serve", help="run the control plane's gRPC API")
    serve.add_argument(
        "--db",
        type=_db_arg,
        default=Path("dpu-limiter.db"),
        help="the state: a SQLite file (default dpu-limiter.db) or postgresql://USER@HOST:PORT/DB",
    )
    serve.add_argument("--listen", default=DEFAULT_SERVER, help=f"listen address (default {DEFAULT_SERVER})")
    serve.add_argument("--metrics-listen", metavar="ADDR", help="serve Prometheus metrics on ADDR (e.g. :9100)")
    serve.add_argument(
        "--lease-s",
        type=float,
        default=DEFAULT_LEASE_S,
        help=f"lease lifetime: a DPU out of touch this long falls to its floor (default {DEFAULT_LEASE_S:g} s)",
    )
    serve.add_argument(
        "--resync-s",
        type=float,
        default=RESYNC_S,
        help=f"read every DPU back against desired state this often, correcting drift (default {RESYNC_S:g} s)",
    )
    serve.add_argument(
        "--pipeline-check-s",
        type=float,
        default=PIPELINE_CHECK_S,
        help="hash the pipeline every DPU says it runs this often, loading ours again where it differs; "
        f"0: only when its reads fail (default {PIPELINE_CHECK_S:g} s)",
    )
    serve.add_argument(
        "--max-installs",
        type=int,
        default=MAX_INSTALLS,
        help=f"push the pipeline to at most this many DPUs at once (default {MAX_INSTALLS})",
    )
    serve.add_argument(
        "--max-reconciles",
        type=int,
        default=MAX_RECONCILES,
        help=f"write and read back at most this many DPUs at once; the rest wait their turn, in order "
        f"(default {MAX_RECONCILES})",
    )
    serve.add_argument(
        "--tls-dir",
        type=Path,
        help="mutual TLS on the API: DIR/ca.pem, DIR/server.pem, DIR/server.key "
        "(make them with `dpu-limiter certs init DIR`); client roles come from their certificates",
    )
    serve.add_argument(
        "--p4runtime-tls-dir",
        type=Path,
        help="mutual TLS toward the DPUs: DIR/ca.pem verifies them, "
        "DIR/verifier.pem and .key identify the control plane",
    )
    serve.add_argument(
        "--replica-id",
        default="",
        help="with a postgresql:// --db, this replica's name among those serving the database "
        "(default: host-pid-random)",
    )
    serve.add_argument(
        "--advertise",
        metavar="ADDR",
        default="",
        help="with a postgresql:// --db, the API address other replicas name this one by (default: --listen's)",
    )
    serve.add_argument(
        "--replica-lease-s",
        type=float,
        default=REPLICA_LEASE_S,
        help="with a postgresql:// --db, this replica's lease in the database: the others take its DPUs this long "
        f"after it stops renewing (default {REPLICA_LEASE_S:g} s)",
    )
    serve.add_argument(
        "--backup-streams",
        type=int,
        default=BACKUP_STREAMS,
        metavar="N",
        help="with a postgresql:// --db, how many replicas after each pod's holder (the next in line to take it "
        "over) keep a backup stream to its DPUs, so that a takeover needs no new connection "
        f"(default {BACKUP_STREAMS}; 0: none)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    certs = sub.add_parser("certs", help="make a test CA and certificates").add_subparsers(
        dest="certs_cmd", required=True, metavar="CERTS_COMMAND"
    )
    cinit = certs.add_parser("init", help="CA, server certificate and one client certificate per role in DIR")
    cinit.add_argument("dir", type=Path)
    cinit.add_argument(
        "--host", action="append", default=[], help="server name or address (default 127.0.0.1, localhost); repeatable"
    )
    cinit.add_argument(
        "--force", action="store_true", help="replace DIR's CA (certificates issued from it stop working)"
    )
    cissue = certs.add_parser(
        "issue", help="another certificate from DIR's CA: a client's (--role) or a server's, e.g. a DPU's (--host)"
    )
    cissue.add_argument("dir", type=Path)
    cissue.add_argument("name")
    who = cissue.add_mutually_exclusive_group(required=True)
    who.add_argument("--role", choices=["verifier", "operator"], help="a client certificate with this role")
    who.add_argument("--host", action="append", help="a server certificate for this name or address; repeatable")
    cissue.add_argument("--days", type=int, default=365, help="validity, days (at least 1)")

    cap = sub.add_parser("cap", help="set or get a pod's cap").add_subparsers(
        dest="cap_cmd", required=True, metavar="CAP_COMMAND"
    )
    cset = cap.add_parser(
        "set", help="set a pod's cap (rates in bit/s: 20M, 1G, ...); window, mode and rebalance stay unless given"
    )
    cset.add_argument("pod")
    cset.add_argument("--egress", required=True, help="rate out of the pod, bit/s (e.g. 1G)")
    cset.add_argument("--ingress", required=True, help="rate into the pod, bit/s")
    cset.add_argument("--window", type=float, help="averaging window, seconds (needed for a pod's first cap)")
    cset.add_argument("--burst", type=int, default=0, help="meter burst, bytes (default: 100 ms at the rate)")
    cset.add_argument(
        "--mode",
        choices=["rate", "window"],
        help="rate: a two-rate meter (a first cap's default); window: at most rate x window bytes in any window",
    )
    cset.add_argument(
        "--rebalance",
        action=argparse.BooleanOptionalAction,
        help="node placement: move unused share between the pod's nodes from measured usage (or not)",
    )
    cget = cap.add_parser("get", help="show a pod's cap")
    cget.add_argument("pod")
    aud = sub.add_parser("audit", help="the hash-chained log of every change").add_subparsers(
        dest="audit_cmd", required=True, metavar="AUDIT_COMMAND"
    )
    for name, text in (
        ("verify", "check the chain, and the stored state against it; exit 1 if either was tampered with"),
        ("log", "print the records"),
    ):
        a = aud.add_parser(name, help=text)
        a.add_argument(
            "--db", type=_db_arg, required=True, help="the control plane's state file (or a copy), or postgresql:// URL"
        )
        a.add_argument("--json", action="store_true", help="JSON output for scripts")
        if name == "verify":
            a.add_argument("--anchor", help="a head hash seen earlier: also detect records cut off the end")
    ap_apply = sub.add_parser("apply", help="create or update pods, DPUs and caps from a file (or a lab topology)")
    ap_apply.add_argument("-f", "--file", type=Path, required=True, help="manifest or lab topology YAML")
    ap_apply.add_argument("--dry-run", action="store_true", help="check it all and show the diff, change nothing")
    ap_delete = sub.add_parser(
        "delete", help="delete what a file names (its caps, DPUs and pods), or pods, DPUs or caps by name"
    )
    ap_delete.add_argument("-f", "--file", type=Path, help="manifest or lab topology YAML")
    ap_delete.add_argument(
        "kind", nargs="?", choices=["pod", "pods", "dpu", "dpus", "cap", "caps", "router", "routers"]
    )
    ap_delete.add_argument("names", nargs="*", help="names of that kind (a cap is named by its pod)")
    ap_delete.add_argument("--dry-run", action="store_true", help="check and show what would go, change nothing")
    ap_delete.add_argument("--ignore-not-found", action="store_true", help="skip names that do not exist")
    for p in (ap_apply, ap_delete):
        p.add_argument(
            "--wait",
            type=_wait_arg,
            default=0.0,
            metavar="SECONDS",
            help="then wait until every DPU the server holds applied the write (exit 1 naming those that did "
            f"not within SECONDS, 0..{MAX_STATUS_WAIT_S:g})",
        )
    get = sub.add_parser("get", help="list pods, DPUs or caps")
    get.add_argument(
        "kind", choices=["pods", "dpus", "caps", "routers", "all"], help="all: a manifest apply -f takes back"
    )
    usage = sub.add_parser("usage", help="bytes across each pod's boundary, by class and colour")
    usage.add_argument("--pod", default="")
    usage.add_argument("--watch", action="store_true", help="keep showing rates (bit/s) until Ctrl-C")
    usage.add_argument("--interval", type=float, default=1.0, help="seconds between samples with --watch")
    usage.add_argument("--per-dpu", action="store_true", help="each DPU's own counters too (a node's, with node DPUs)")
    status = sub.add_parser("status", help="whether every DPU holds the desired state")
    status.add_argument(
        "--held-here", action="store_true", help="only the DPUs the replica asked holds (not those held elsewhere)"
    )
    for p in (cset, cget, usage, sub.choices["status"], ap_apply, ap_delete, get):
        p.add_argument("--server", default=DEFAULT_SERVER, help=f"control plane address (default {DEFAULT_SERVER})")
        p.add_argument("--json", action="store_true", help="JSON output for scripts")
        p.add_argument("--tls-dir", type=Path, help="talk mutual TLS with DIR/ca.pem and your role's DIR/ROLE.pem/.key")
        p.add_argument(
            "--as",
            dest="role",
            default="verifier",
            choices=["verifier", "operator"],
            help="which certificate in --tls-dir to present (default verifier)",
        )
    return ap, dict(sub.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dpu-limiter` console script."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    command = commands.get(args_in[0]) if args_in else None
    raw: RawHandler | None = command.get_default("raw") if command is not None else None
    if raw is not None:  # a plugin command that parses its own options
        return raw(args_in[1:], f"dpu-limiter {args_in[0]}")
    args = parser.parse_args(args_in)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is not None:  # a plugin's command
        return handler(args)
    if args.cmd == "audit":
        return _audit(args)
    if args.cmd == "certs":
        return _certs(args)
    if args.cmd == "serve":
        from .reconciler import Concurrency
        from .server import serve
        from .settings import Settings
        from .store import StateMismatch, shown_db

        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from .tls import TlsFiles

        tls = (
            TlsFiles(args.tls_dir / "ca.pem", args.tls_dir / "server.pem", args.tls_dir / "server.key")
            if args.tls_dir
            else None
        )
        p4rt = args.p4runtime_tls_dir
        p4rt_tls = TlsFiles(p4rt / "ca.pem", p4rt / "verifier.pem", p4rt / "verifier.key") if p4rt else None
        try:
            _check_listen("--listen", args.listen)
            if args.metrics_listen:
                _check_listen("--metrics-listen", args.metrics_listen)
            if not args.lease_s > 0:
                raise ValueError(f"--lease-s: must be > 0 seconds, got {args.lease_s!r}")
            if not args.resync_s > 0:
                raise ValueError(f"--resync-s: must be > 0 seconds, got {args.resync_s!r}")
            if not args.pipeline_check_s >= 0:
                raise ValueError(f"--pipeline-check-s: must be >= 0 seconds, got {args.pipeline_check_s!r}")
            for flag, value in (("--max-installs", args.max_installs), ("--max-reconciles", args.max_reconciles)):
                if value < 1:
                    raise ValueError(f"{flag}: must be at least 1, got {value}")
            asyncio.run(
                serve(
                    args.db,
                    args.listen,
                    Settings(
                        p4runtime_tls=p4rt_tls,
                        lease_s=args.lease_s,
                        resync_s=args.resync_s,
                        pipeline_check_s=args.pipeline_check_s,
                        concurrency=Concurrency(args.max_installs, args.max_reconciles),
                        replica_id=args.replica_id,
                        advertise=args.advertise,
                        replica_lease_s=args.replica_lease_s,
                        backup_streams=args.backup_streams,
                    ),
                    args.metrics_listen,
                    tls,
                )
            )
        except StateMismatch as exc:  # the file is not what its log says: tampered, not a bad flag
            print(f"dpu-limiter: {exc}", file=sys.stderr)
            return 1
        except sqlite3.DatabaseError as exc:
            print(f"dpu-limiter: --db {shown_db(args.db)}: {exc}", file=sys.stderr)
            return 1
        except (ValueError, OSError) as exc:
            print(f"dpu-limiter: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        _check_client_args(args)
        return asyncio.run(_client_cmd(args))
    except ValueError as exc:  # bad flags, or TLS files that cannot be read
        print(f"dpu-limiter: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        hint = ""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and args.tls_dir is None:
            hint = " (if the control plane runs with --tls-dir, give yours: --tls-dir DIR)"
        print(f"dpu-limiter: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
        return 1


def _check_client_args(args: argparse.Namespace) -> None:
    """Flags the server would refuse anyway, refused here with the flag's name (ValueError)."""
    if args.cmd == "cap" and args.cap_cmd == "set" and args.burst is not None and args.burst < 0:
        raise ValueError(f"--burst: must be >= 0 bytes (0: the default), got {args.burst}")
    if args.cmd == "usage" and args.watch and not 0.1 <= args.interval <= 3600:
        raise ValueError(f"--interval: must be 0.1..3600 seconds, got {args.interval}")
    if args.cmd == "delete" and ((args.file is None) == (args.kind is None) or (args.kind and not args.names)):
        raise ValueError("delete: give either -f FILE or a kind (pod, dpu, cap, router) and names")


def _db_arg(value: str) -> Path | str:
    """`--db`: a URL as given (a Path would fold its //), anything else a SQLite file."""
    from .store import is_url

    return value if is_url(value) or value.startswith("sqlite:") else Path(value)


def _wait_arg(value: str) -> float:
    """`--wait`: seconds, 0..MAX_STATUS_WAIT_S."""
    from .models import check_seconds, shown

    try:
        return check_seconds("--wait", float(value), 0, MAX_STATUS_WAIT_S)
    except ValueError:  # InvalidArgument too; the message names the text as typed
        raise argparse.ArgumentTypeError(f"must be 0..{MAX_STATUS_WAIT_S:g} seconds (got {shown(value)})") from None


def _check_listen(flag: str, value: str) -> None:
    """A host:port to listen on (port 0: any free one); ValueError names the flag."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag}: must be host:port with a port in 0..65535 (got {value!r})")


def _certs(args: argparse.Namespace) -> int:
    from . import tls

    if args.certs_cmd == "init":
        if (args.dir / "ca.pem").exists() and not args.force:
            print(
                f"dpu-limiter: certs init: {args.dir / 'ca.pem'} exists, and certificates issued from it would stop "
                "working; use `certs issue` for more, or --force to replace the CA",
                file=sys.stderr,
            )
            return 2
        made = tls.init(args.dir, args.host or ["127.0.0.1", "localhost"])
        for name, files in made.items():
            print(f"{name}: {files.cert} (key {files.key})")
        print(f"CA: {args.dir / 'ca.pem'}")
        return 0
    from .models import InvalidArgument, check_name

    try:
        check_name("name", args.name)  # it names the files: no paths
        if args.name == "ca" or (args.dir / f"{args.name}.pem").exists():
            raise InvalidArgument("name", args.name, f"{args.dir / args.name}.pem exists (or is the CA's)")
        if args.days < 1:
            raise InvalidArgument("--days", args.days, "must be at least 1")
        if not (args.dir / "ca.key").is_file():
            raise InvalidArgument("dir", str(args.dir), "has no ca.key (make one with `certs init DIR`)")
    except InvalidArgument as exc:
        print(f"dpu-limiter: certs issue: {exc}", file=sys.stderr)
        return 2
    files = tls.issue(args.dir, args.name, args.role, hosts=args.host, days=args.days)
    print(f"{args.name} ({args.role or 'server: ' + ', '.join(args.host)}): {files.cert} (key {files.key})")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from .store import shown_db
    from .stores import read_audit, verify_file

    try:
        if args.audit_cmd == "verify":
            verdict = verify_file(args.db, args.anchor)
        else:
            records = read_audit(args.db)
    except (FileNotFoundError, sqlite3.DatabaseError, ValueError) as exc:
        print(f"dpu-limiter: --db {shown_db(args.db)}: {exc}", file=sys.stderr)
        return 2
    if args.audit_cmd == "log":
        if args.json:
            print(json.dumps([r.__dict__ for r in records], indent=2))
        else:
            for r in records:
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.ts))
                print(f"{r.seq:6d} {when} {r.actor:8s} {r.action:12s} {r.object:24s} {json.dumps(r.payload)}")
        return 0
    if args.json:
        print(json.dumps(verdict.as_dict(), indent=2))
    elif verdict.ok:
        print(f"audit log intact: {verdict.records} records, head {verdict.head}; stored state matches it")
    elif verdict.check == "state":
        print(f"stored state TAMPERED (not what the audit log says): {verdict.problem}", file=sys.stderr)
    else:
        print(f"audit log TAMPERED: {verdict.problem}", file=sys.stderr)
    return 0 if verdict.ok else 1


async def _client_cmd(args: argparse.Namespace) -> int:
    from .client import LimiterClient, PodCap, Status, Usage, as_dict
    from .models import Cap, shown
    from .tls import TlsFiles
    from .units import UnitError, parse_rate

    manifest: Manifest | None = None
    if args.cmd in ("apply", "delete") and args.file is not None:
        # A bad file is refused before any connection is opened: it never reaches the network.
        from .manifest import ManifestError, load_manifest

        try:
            manifest = load_manifest(args.file)
        except ManifestError as exc:
            print(f"dpu-limiter: {exc}", file=sys.stderr)
            return 2
    d = args.tls_dir
    tls = TlsFiles(d / "ca.pem", d / f"{args.role}.pem", d / f"{args.role}.key") if d else None
    async with LimiterClient(args.server, tls) as c:
        if args.cmd == "usage" and args.watch:
            return await display.watch_usage(c, args)
        if args.cmd == "apply":
            assert manifest is not None  # -f is required by the parser
            return await _apply(c, manifest, args)
        if args.cmd == "delete":
            return await _delete(c, manifest, args)
        if args.cmd == "get":
            return await display.get_objects(c, args)
        if args.cmd == "cap" and args.cap_cmd == "set":
            try:
                egress, ingress = parse_rate(args.egress, "--egress"), parse_rate(args.ingress, "--ingress")
            except UnitError as exc:
                print(f"dpu-limiter: {exc}", file=sys.stderr)
                return 2
            window, mode, rebalance = args.window, args.mode, args.rebalance
            if None in (window, mode, rebalance):  # what is not given stays as the pod's cap has it
                try:
                    old: Cap | None = (await c.get_pod_cap(args.pod)).cap
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    old = None
                if window is None and old is None:
                    print(f"dpu-limiter: --window: needed, pod {shown(args.pod)} has no cap yet", file=sys.stderr)
                    return 2
                if old is not None:
                    window = old.window_s if window is None else window
                    mode = old.mode if mode is None else mode
                    rebalance = old.rebalance if rebalance is None else rebalance
            cap = Cap(egress, ingress, window, args.burst, bool(rebalance), mode or "rate")
            msg: PodCap | Usage | Status = await c.set_pod_cap(args.pod, cap)
        elif args.cmd == "cap":
            msg = await c.get_pod_cap(args.pod)
        elif args.cmd == "usage":
            msg = await c.usage(args.pod, args.per_dpu)
        else:
            msg = await c.status(held_here=args.held_here)
    doc = as_dict(msg)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        display.print_table(args.cmd, doc, held_here=getattr(args, "held_here", False))
    return 0


async def _apply(c: LimiterClient, manifest: Manifest, args: argparse.Namespace) -> int:
    try:
        written = await c.apply(manifest.pods, manifest.dpus, manifest.caps, manifest.routers, dry_run=args.dry_run)
    except grpc.aio.AioRpcError as exc:  # nothing of the file was stored
        print(f"dpu-limiter: {args.file}: {exc.code().name}: {exc.details()}; nothing applied", file=sys.stderr)
        return 1
    display.print_changes(written, f"{args.file}{' (dry run)' if args.dry_run else ''}", args)
    return await _waited(c, written.generation, args)


async def _delete(c: LimiterClient, m: Manifest | None, args: argparse.Namespace) -> int:
    from .models import cut

    names: dict[str, list[str]]  # by kind: pods, dpus, caps, routers
    if m is not None:
        # Everything the file names: its routers, caps, DPUs and pods (with their caps).
        names = {
            "pods": [p.name for p in m.pods],
            "dpus": [d.name for d in m.dpus],
            "caps": list(m.caps),
            "routers": [r.name for r in m.routers],
        }
        title = str(args.file)
    else:
        kind = args.kind.rstrip("s") + "s"
        names = {kind: args.names}
        title = f"{kind} {cut(', '.join(args.names))}"  # the names as given may be any length
    try:
        written = await c.delete(
            names.get("pods", ()),
            names.get("dpus", ()),
            names.get("caps", ()),
            names.get("routers", ()),
            dry_run=args.dry_run,
            missing_ok=args.ignore_not_found,
        )
    except grpc.aio.AioRpcError as exc:
        print(f"dpu-limiter: {title}: {exc.code().name}: {exc.details()}; nothing deleted", file=sys.stderr)
        return 1
    display.print_changes(written, f"{title}{' (dry run)' if args.dry_run else ''}", args)
    return await _waited(c, written.generation, args)


async def _waited(c: LimiterClient, generation: int, args: argparse.Namespace) -> int:
    """With --wait, wait until every DPU the server holds applied `generation` (a write's): 1, naming the DPUs
    that lag, if they did not within --wait seconds."""
    if not args.wait or args.dry_run:
        return 0
    try:
        await c.wait_converged(args.wait, generation)
    except TimeoutError as exc:
        print(f"dpu-limiter: generation {generation}: {exc}", file=sys.stderr)
        return 1
    except grpc.aio.AioRpcError as exc:  # the write itself is stored: say so
        why = f"{exc.code().name}: {exc.details()}"
        print(f"dpu-limiter: generation {generation} is stored; waiting for the DPUs failed: {why}", file=sys.stderr)
        return 1
    if not args.json:
        print(f"every DPU applied generation {generation}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
