"""dpu_lab.processes: what the lab started is stopped by its handle, killed only if it ignores SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from dpu_lab.processes import stop_processes

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
)


def test_stop_processes_terminates_then_kills_only_what_lingers() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # its handler is in place
        done.wait(timeout=30)
        t0 = time.monotonic()
        killed = stop_processes(polite, stubborn, done, timeout=1.0)
        assert time.monotonic() - t0 < 10
        assert killed == [stubborn]
        assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
        assert done.returncode == 0
        assert stop_processes(polite, stubborn, timeout=1.0) == []  # again: nothing signalled twice
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait()
        if stubborn.stdout is not None:
            stubborn.stdout.close()
