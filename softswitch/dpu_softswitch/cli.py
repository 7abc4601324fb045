"""`dpu-limiter target`: the embedded target as a command of dpu-limiter (an entry point of its CLI group)."""

from __future__ import annotations

import argparse


def _run(argv: list[str], prog: str) -> int:
    from .main import main  # the target's imports (gRPC, finsy's protos) only when it runs

    return main(argv, prog=prog)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `target`, which takes simple_switch_grpc's options (dpu_softswitch.main), to dpu-limiter's commands."""
    target = sub.add_parser(
        "target", help="run the embedded P4 target (simple_switch_grpc's options; --help for them)", add_help=False
    )
    target.set_defaults(raw=_run)
