"""Failover between replicas: how long until a dead replica's DPUs are primary elsewhere and read back.

    python bench/replica_failover.py [--dpus 100] [--replicas 3] [--signal KILL|TERM] [--db postgresql://...]

N embedded targets run in one helper process (bench/targets_host.py), one DPU each, one pod per DPU (so
rendezvous hashing spreads them over the replicas). R `dpu-limiter serve` processes share one PostgreSQL
database (a throwaway cluster of tests/helpers/postgres.py unless --db names one). Once every DPU is held,
converged and leased, the replica holding the most DPUs is sent the signal (KILL: kill -9; TERM: it stops and
gives its lease up). Timed from the signal until every DPU it held shows, on a surviving replica's
GetStatus, connected, primary, converged and its lease held (read back). Meanwhile every DPU's lease entry
is read over P4Runtime every 0.2 s and its deadline compared with the DPU's clock (the targets' clock
origins on this host's monotonic clock): the least time any lease had left, and how many DPUs lapsed
(there should be none).

Last line: `dpus=N replicas=R signal=S moved=M failover_s=... replica_lease_s=... least_lease_left_s=...
lapsed_dpus=...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
from finsy.proto import p4r, p4r_grpc

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.units import REPLICA_LEASE_S

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import postgres  # noqa: E402
from helpers.p4rt import lease_entry, schema  # noqa: E402
from helpers.processes import free_port, wait_port  # noqa: E402


class LeaseWatch:
    """Reads every DPU's lease deadline (a P4Runtime Read: no arbitration) and its clock (from its origin)."""

    def __init__(self, addresses: list[str], origins: list[int]) -> None:
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self.origins = origins
        self.read = p4r.ReadRequest(device_id=1, entities=[lease_entry(schema(), 0, 0)])
        self.least: list[float] = [float("inf")] * len(addresses)

    async def _one(self, i: int) -> None:
        stub = p4r_grpc.P4RuntimeStub(self.channels[i])  # type: ignore[no-untyped-call]
        async for reply in stub.Read(self.read):
            for e in reply.entities:
                params = {q.param_id: int.from_bytes(q.value, "big") for q in e.table_entry.action.action.params}
                now_us = (time.monotonic_ns() - self.origins[i]) // 1000
                self.least[i] = min(self.least[i], (params.get(2, 0) - now_us) / 1e6)

    async def run(self) -> None:
        """Sample every 0.2 s until cancelled."""
        while True:
            await asyncio.gather(*(self._one(i) for i in range(len(self.channels))), return_exceptions=True)
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Close the channels."""
        await asyncio.gather(*(c.close() for c in self.channels))


async def held_rows(address: str) -> dict[str, object]:
    """The rows of the DPUs this replica holds (not "elsewhere"), by name."""
    async with LimiterClient(address) as c:
        st = await c.status()
    return {d.name: d for d in st.dpus if d.lease_state != "elsewhere"}


def good(row: object) -> bool:
    """Connected, primary, converged, lease held."""
    return bool(
        row.connected and row.primary and row.converged and row.lease_state in ("held", "renewing")  # type: ignore[attr-defined]
    )


async def run(url: str, n: int, replicas: int, sig: signal.Signals, tmp: Path) -> dict[str, object]:
    """One failover on `url`; its figures."""
    host = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "targets_host.py"), str(n), "--origins"], stdout=subprocess.PIPE
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        assert host.stdout is not None
        addresses = json.loads(host.stdout.readline())
        origins = json.loads(host.stdout.readline())
        ports = {f"r{i}": free_port() for i in range(1, replicas + 1)}
        for r, port in ports.items():
            command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", url, "--listen", f"127.0.0.1:{port}"]
            with (tmp / f"{r}.log").open("ab") as out:
                procs[r] = subprocess.Popen([*command, "--replica-id", r], stdout=out, stderr=subprocess.STDOUT)
        for r, port in ports.items():
            await asyncio.to_thread(wait_port, port, procs[r], 60)
        address = {r: f"127.0.0.1:{p}" for r, p in ports.items()}
        async with LimiterClient(address["r1"]) as c:
            await c.apply(
                pods=[Pod(f"pod-{i}", (f"10.{i // 256}.{i % 256}.0/24",)) for i in range(n)],
                dpus=[Dpu(f"dpu-{i}", a, 1, f"pod-{i}", Role.POD_UPLINK, 0, 1) for i, a in enumerate(addresses)],
                caps={f"pod-{i}": Cap(8e6, 8e6, 10.0, 100_000) for i in range(n)},
            )
        deadline = time.monotonic() + 600
        while True:
            rows = {r: await held_rows(a) for r, a in address.items()}
            by = {name: r for r, rs in rows.items() for name in rs}
            if len(by) == n and all(good(row) for rs in rows.values() for row in rs.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the fleet did not converge")
            await asyncio.sleep(0.5)
        victim = max(rows, key=lambda r: len(rows[r]))
        theirs = sorted(rows[victim])
        survivors = [r for r in address if r != victim]
        watch = LeaseWatch(addresses, origins)
        watching = asyncio.create_task(watch.run())
        await asyncio.sleep(1.0)
        start = time.monotonic()
        os.kill(procs[victim].pid, sig)
        while True:
            now = {r: await held_rows(address[r]) for r in survivors}
            moved = {name for rs in now.values() for name, row in rs.items() if good(row)}
            if all(name in moved for name in theirs):
                took = time.monotonic() - start
                break
            if time.monotonic() - start > 120:
                raise TimeoutError(f"{len(set(theirs) - moved)} of {len(theirs)} DPUs not taken over")
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # a few more samples of the leases after the takeover
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await watch.close()
        return {
            "dpus": n,
            "replicas": replicas,
            "signal": sig.name.removeprefix("SIG"),
            "moved": len(theirs),
            "failover_s": round(took, 2),
            "replica_lease_s": REPLICA_LEASE_S,
            "least_lease_left_s": round(min(watch.least), 2),
            "lapsed_dpus": sum(1 for left in watch.least if left <= 0),
        }
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        host.terminate()
        host.wait(timeout=30)


def main() -> None:
    """Parse the flags, run one failover, print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dpus", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    ap.add_argument("--db", help="a PostgreSQL database (default: a throwaway cluster)")
    args = ap.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        url = args.db or stack.enter_context(postgres.cluster()).database()
        figures = asyncio.run(run(url, args.dpus, args.replicas, sig, Path(tmp)))
    print(" ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
