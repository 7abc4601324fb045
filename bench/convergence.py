"""Time from a cap change to every DPU converged (read back), for 10, 100 and 1000 DPUs.

    python bench/convergence.py [--sizes 10 100 1000]

N embedded targets run in one helper process (bench/targets_host.py); the control plane runs here,
one agent per DPU. After the first convergence (pipeline and entries installed), the pod's cap is
changed and the time until every DPU reads back the new meters is measured. The baseline sends the
same meter writes to the same DPUs one DPU at a time with p4runtime-shell (needs the environment
tests/p4rt_shell/env.sh makes; otherwise baseline=nan). Last lines: `dpus=N converge_s=... baseline_s=... ratio=...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane

ROOT = Path(__file__).resolve().parent.parent
SHELL_PY = ROOT / ".venv-p4rt-shell" / "bin" / "python"


async def converge(addresses: list[str], tmp: Path) -> tuple[float, float]:
    """(seconds to first convergence, seconds from a cap change to convergence)."""
    plane = ControlPlane(tmp / "state.db", "127.0.0.1:0", rebalance_loop=False)
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            t0 = time.monotonic()
            await c.apply_pod("a", ["10.0.1.0/24"])
            for i, addr in enumerate(addresses):
                await c.register_dpu(
                    pb.Dpu(
                        name=f"dpu-{i}",
                        p4runtime_address=addr,
                        device_id=1,
                        pod="a",
                        role=pb.DPU_ROLE_POD_UPLINK,
                        host_port=0,
                        uplink_port=1,
                    )
                )
            await c.set_pod_cap("a", 1e9, 1e9, 60.0)
            await c.wait_converged(timeout=600)
            first = time.monotonic() - t0
            t1 = time.monotonic()
            await c.set_pod_cap("a", 2e9, 2e9, 60.0)
            # The service's own wait (event-driven), not the API's status polling, to time it finely.
            assert await plane.service.wait_converged(timeout=600)
            return first, time.monotonic() - t1
    finally:
        await plane.stop()


def baseline(addresses: list[str]) -> float:
    """Seconds p4runtime-shell takes to send the same meter writes one DPU at a time."""
    if not SHELL_PY.exists():
        return math.nan
    res = subprocess.run(
        [str(SHELL_PY), str(ROOT / "bench" / "p4rt_shell_writes.py"), "250000000", "25000000", *addresses],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
        return math.nan
    return float(res.stdout.strip().splitlines()[-1])


def main() -> int:
    """Measure each size and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    args = ap.parse_args()
    logging.getLogger("finsy").setLevel(logging.CRITICAL)
    lines = []
    for n in args.sizes:
        host = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "targets_host.py"), str(n)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert host.stdout is not None
            addresses = json.loads(host.stdout.readline())
            with tempfile.TemporaryDirectory() as tmp:
                first, change = asyncio.run(converge(addresses, Path(tmp)))
            base = baseline(addresses)
        finally:
            host.terminate()
            host.wait(timeout=30)
        print(
            f"dpus={n}: first convergence {first:.2f} s, cap change converged in {change:.3f} s, "
            f"p4runtime-shell one by one {base:.3f} s",
            file=sys.stderr,
        )
        lines.append(f"dpus={n} converge_s={change:.3f} baseline_s={base:.3f} ratio={base / change:.1f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
