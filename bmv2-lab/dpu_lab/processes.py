"""Stopping processes the lab started: by the handles it recorded, never by name or pattern."""

from __future__ import annotations

import logging
import subprocess
from typing import Any

LOG = logging.getLogger(__name__)


def stop_processes(
    *procs: subprocess.Popen[Any], timeout: float, kill_timeout: float = 5.0
) -> list[subprocess.Popen[Any]]:
    """SIGTERM each of `procs` still running, wait up to `timeout` s for each, then kill it; return those killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    killed = []
    for proc in procs:  # all were signalled first: they exit side by side, not one timeout after another
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            killed.append(proc)
            try:
                proc.wait(timeout=kill_timeout)
            except subprocess.TimeoutExpired:  # stuck in the kernel: say so, and let the cleanup go on
                LOG.warning("pid %d still there %g s after SIGKILL", proc.pid, kill_timeout)
    return killed
