"""Baseline for bench/convergence.py, run with the p4runtime-shell environment's python: the same
meter writes sent one DPU at a time, one write per request, as a script around p4runtime-shell does
(p4runtime-shell holds one connection at a time: each DPU is set up, written and torn down in turn).

    .venv-p4rt-shell/bin/python bench/p4rt_shell_writes.py RATE_BYTES_S BURST ADDR...

Prints the seconds it took in all, then (last line) the part of that spent in the writes alone.
"""

from __future__ import annotations

import sys
import time

import p4runtime_sh.shell as sh


def main() -> int:
    """Write both meter cells of every DPU; print the seconds it took, in all and in the writes."""
    rate, burst, addresses = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    writing = 0.0
    start = time.monotonic()
    for addr in addresses:
        sh.setup(device_id=1, grpc_addr=addr, election_id=(0, 2), verbose=False)
        t = time.monotonic()
        for cell in (0, 1):
            m = sh.MeterEntry("LimiterIngress.boundary_meter")
            m.index = cell
            m.cir, m.cburst, m.pir, m.pburst = rate, burst, rate, burst
            m.modify()
        writing += time.monotonic() - t
        sh.teardown()
    print(f"{time.monotonic() - start:.3f}")
    print(f"{writing:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
