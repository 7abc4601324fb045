"""The lab's commands of `dpu-limiter`: `lab run` and `lab sweep`.

The control plane's CLI finds them through the `dpu_limiter.cli` entry point group (pyproject.toml), so
that it imports nothing of the lab and runs without it. Building the parsers needs only argparse;
what the commands run (numpy, matplotlib, pyroute2, thrift, pydantic: the `lab` extra) is imported
when they run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

    from .config import Scenario
    from .report import Report

Handler = Callable[[argparse.Namespace], int]
# Top-level modules of the lab's own dependencies (pyproject.toml's `lab` extra).
LAB_DEPENDENCIES = frozenset({"numpy", "matplotlib", "pyroute2", "thrift", "pydantic"})


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `lab` and its commands to dpu-limiter's subcommands."""
    lab = sub.add_parser("lab", help="the emulation lab").add_subparsers(
        dest="lab_cmd", required=True, metavar="LAB_COMMAND"
    )
    run = lab.add_parser(
        "run",
        help="run a scenario and write report.json, throughput.png, summary.md",
        description="Build the scenario's network in namespaces, start one P4 target per limiter "
        "and the control plane, apply the caps through its API, drive the traffic, measure at the "
        "receivers, write the report, and remove everything it made. Needs root.",
    )
    run.add_argument("scenario", type=Path, help="scenario YAML (e.g. bmv2-lab/scenarios/two-pods.yaml)")
    run.add_argument("--out", type=Path, required=True, help="output folder")
    run.add_argument(
        "--target",
        choices=["embedded", "bmv2"],
        default="embedded",
        help="P4 target per limiter: the embedded target (default) or simple_switch_grpc",
    )
    run.add_argument(
        "--time",
        choices=["real", "virtual"],
        default="real",
        help="real time on network namespaces (default, needs root), or virtual time: a simulated network "
        "around embedded targets on one simulated clock (UDP flows only, for now)",
    )
    run.add_argument(
        "--segment-bytes",
        type=int,
        metavar="N",
        help="with --time virtual: send UDP payload segments of N bytes (as TSO does) instead of the flows' size",
    )
    sweep = lab.add_parser(
        "sweep",
        help="run a scenario over a grid (caps x placements x attacks) in virtual time; write sweep.csv, sweep.png",
        description="Run every point of a sweep file (bmv2-lab/dpu_lab/sweep.py) in virtual time, in parallel "
        "processes, each with its own report folder under --out, then one table and one figure.",
    )
    sweep.add_argument("sweep", type=Path, help="sweep YAML (e.g. bmv2-lab/sweeps/attacks.yaml)")
    sweep.add_argument("--out", type=Path, required=True, help="output folder")
    sweep.add_argument("--jobs", type=int, default=None, help="parallel runs (default: one per core)")
    sweep.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the points on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://host:8786) instead of "
        "local processes; --out must be on a file system its workers share",
    )
    run.add_argument(
        "--no-calibrate",
        action="store_true",
        help="real time: skip measuring first what the target carries here (and refusing a scenario it cannot carry)",
    )
    run.add_argument(
        "--rescale",
        action="store_true",
        help="real time: scale every rate and burst down to what calibration found the target carries, "
        "rather than refuse (the report says by how much)",
    )
    run.add_argument(
        "--traffic",
        choices=["auto", "iperf3", "builtin"],
        default="auto",
        help="traffic generator: iperf3 where installed (auto, the default), else the built-in one",
    )
    run.add_argument(
        "--control-db",
        metavar="URL",
        help="real time, a scenario with control_plane.replicas > 1: the PostgreSQL database the replicas share "
        "(postgresql://USER@HOST:PORT/DB); the run works in a schema of its own there and drops it at the end",
    )
    run.add_argument(
        "--control-db-ctl",
        metavar="CMD",
        help="a command that stops and starts that database, run as `CMD stop` and `CMD start` "
        "(restart-db events; e.g. 'pg_ctlcluster 16 main')",
    )
    run.set_defaults(handler=_needs_the_extra(_lab_run))
    sweep.set_defaults(handler=_needs_the_extra(_lab_sweep))


def _needs_the_extra(run: Handler) -> Handler:
    """`run`, saying how to install the lab's dependencies (exit 2) when one is missing."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in LAB_DEPENDENCIES:
                raise
            print(
                f"dpu-limiter: the lab needs {exc.name}, which is not installed: pip install 'dpu-limiter[lab]'",
                file=sys.stderr,
            )
            return 2

    return handler


def _lab_sweep(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .sweep import run_sweep

    if args.jobs is not None and args.jobs < 1:
        print(f"dpu-limiter: --jobs: must be >= 1 (got {args.jobs})", file=sys.stderr)
        return 2
    try:
        rows = run_sweep(args.sweep, args.out, args.jobs, args.scheduler)
    except ConfigError as exc:
        print(f"dpu-limiter: {exc}", file=sys.stderr)
        return 2
    held = sum(1 for r in rows if r["compliant"])
    print(f"{len(rows)} runs, cap held in {held}; {args.out / 'sweep.csv'}, {args.out / 'sweep.png'}")
    return 0


def _lab_run(args: argparse.Namespace) -> int:
    import grpc

    from .calibrate import CalibrationError
    from .config import ConfigError, load_scenario
    from .netns import NetError
    from .runner import LabRun, default_traffic
    from .targets import TargetError

    try:
        scenario = load_scenario(args.scenario)
    except ConfigError as exc:
        print(f"dpu-limiter: {exc}", file=sys.stderr)
        return 2
    if args.time == "virtual":
        return _lab_run_virtual(args, scenario)
    try:
        traffic = default_traffic() if args.traffic == "auto" else args.traffic
        if traffic == "iperf3" and not shutil.which("iperf3"):
            print(
                "dpu-limiter: --traffic iperf3 needs iperf3 on PATH (Debian: apt-get install iperf3)", file=sys.stderr
            )
            return 2
        report = LabRun(
            scenario,
            args.out,
            args.target,
            traffic,
            calibrate=not args.no_calibrate,
            rescale=args.rescale,
            control_db=args.control_db,
            control_db_ctl=args.control_db_ctl,
        ).run()
    except ConfigError as exc:
        print(f"dpu-limiter: {exc}", file=sys.stderr)
        return 2
    except CalibrationError as exc:
        print(f"dpu-limiter: calibration: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:  # the control plane refused what the scenario asked (the run cleaned up)
        print(f"dpu-limiter: {args.scenario}: {_refusal(exc)}; the run was stopped and cleaned up", file=sys.stderr)
        return 2
    except (NetError, TargetError, TimeoutError, RuntimeError) as exc:
        print(f"dpu-limiter: lab run failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dpu-limiter: interrupted; everything the run created was removed", file=sys.stderr)
        return 130
    return exit_status(report)


def exit_status(report: Report) -> int:
    """`lab run`'s exit status for a finished run: 0 the cap held and the run ran as written with no outage, 3
    a cap did not hold, 4 it held but the run failed otherwise (report.failures: a lease lapsed, an event
    skipped)."""
    if not report.cap_held:
        return 3
    return 4 if report.failures else 0


def _refusal(exc: grpc.RpcError) -> str:
    """A control plane's refusal as one bounded line: its status code and details."""
    from dpu_limiter.models import cut

    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    name = getattr(code, "name", "ERROR")
    return f"the control plane refused: {name}: {cut(' '.join(str(details or '').split()), 300)}"


def _lab_run_virtual(args: argparse.Namespace, scenario: Scenario) -> int:
    from .config import ConfigError
    from .virtual import VirtualLabRun

    if args.target != "embedded":
        print(
            "dpu-limiter: --time virtual runs on the embedded target only (bmv2 has no virtual clock)", file=sys.stderr
        )
        return 2
    if scenario.control_plane.replicas > 1 or args.control_db:
        print(
            "dpu-limiter: control_plane.replicas, --control-db: replicas on PostgreSQL run in real time only",
            file=sys.stderr,
        )
        return 2
    if args.segment_bytes is not None and not 18 <= args.segment_bytes <= 1 << 20:
        print(f"dpu-limiter: --segment-bytes: must be 18..1048576 (got {args.segment_bytes})", file=sys.stderr)
        return 2
    try:
        report = VirtualLabRun(scenario, args.out, args.segment_bytes).run()
    except ConfigError as exc:
        print(f"dpu-limiter: {exc}", file=sys.stderr)
        return 2
    return exit_status(report)
