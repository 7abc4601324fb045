"""A cap change at fleet size: one SQLite control plane against the bare P4Runtime calls' floor, and 1, 2 and 4
replicas on PostgreSQL sharing the same DPUs, side by side in one run.

    python bench/replica_scale.py [--dpus 1000] [--pods 100] [--replicas 1 2 4] [--no-bracket] [--logs DIR]

N embedded targets run in one helper process (bench/targets_host.py) for the whole run; every configuration
drives the same targets, one after the other:

- sqlite: bench/convergence.py's measurement, in this process: one control plane on a SQLite file, the N DPUs
  parallel devices of one pod, three cap changes (every share 0.5 -> 1 -> 0.5 -> 1 Gbit/s). converge_s is from
  SetPodCap until every agent wrote and read back its new meters (median of three); floor_s is the same two
  calls per DPU (Write, Read) prebuilt and sent over the control plane's own connections with no control plane
  around them, after each change (median of three); echo_s as many calls to an echo service (gRPC alone).
  baseline_s is p4runtime-shell writing the same meters one DPU at a time (convergence.py's baseline).
  Measured before the replicas and, unless --no-bracket, again after them (the load moves during a run).
- pg: R `dpu-limiter serve` processes on a fresh database of one throwaway PostgreSQL cluster
  (tests/helpers/postgres.py), the N DPUs in P pods (DPU i in pod i mod P), so rendezvous hashing of pods
  spreads them over the replicas (each replica's count is printed). Once all are converged, three cap changes,
  each one Apply through replica r1 setting every pod's cap (every share as above). converge_s is from the
  Apply until every replica's GetStatus answers every DPU it holds converged at the Apply's generation or later
  (one call to each that waits for it: GetStatus's wait_s): the writer plans, stores (one PostgreSQL commit)
  and pushes its pods; the others see the change log's head move (told by PostgreSQL, a poll every 0.2 s
  behind it), read the state again and push theirs. After each change (not timed) every DPU's meter cells
  are read afresh over a new connection: all must hold the same meters, unlike the change's before. There is
  no floor of its own: over_floor divides by the sqlite floor measured in the same run (the mean of both when
  bracketed).

CPU seconds of the control plane(s) and of the targets' process during the median change are printed too.

Last lines, one per configuration: `config=sqlite dpus=N pods=1 converge_s=... floor_s=... echo_s=...
over_floor=... baseline_s=... ratio=... plane_cpu_s=... targets_cpu_s=... load1=...`, then `config=pg replicas=R
dpus=N pods=P held=A/B/.. apply_s=... converge_s=... floor_s=... over_floor=... ratio=... plane_cpu_s=...
targets_cpu_s=... load1=...` (over_floor = converge_s / floor_s, the goal is 1.3 at most; ratio =
baseline_s / converge_s; load1 the one-minute load average as the configuration ended).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import finsy as fy
import grpc
from convergence import BURST_PER_DPU, ROUNDS, Figures, baseline, converge, cpu_s, fmt
from finsy.proto import p4r, p4r_grpc
from replica_failover import caps, fleet, start_host, start_replicas, stop_replicas, wait_fleet

from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient
from helpers import postgres  # on the path once replica_failover is imported
from helpers.processes import stop

SHARES = (1e9, 0.5e9)  # every DPU's share, alternately, as convergence.py changes it


def load1() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


async def read_meters(addresses: list[str]) -> list[tuple[tuple[int, int, int, int, int], ...]]:
    """Every DPU's meter cells (index, CIR, CBS, PIR, PBS), read afresh over a new connection."""
    program = dp.limiter_program()
    meter_id = fy.P4Schema(program.p4info, program.bmv2_json).meters[dp.METER].id
    cells = [
        p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meter_id, index=p4r.Index(index=c))) for c in dp.METER_CELLS
    ]
    limit = asyncio.Semaphore(100)

    async def one(addr: str) -> tuple[tuple[int, int, int, int, int], ...]:
        held = []
        async with limit, grpc.aio.insecure_channel(addr) as channel:
            stub = p4r_grpc.P4RuntimeStub(channel)  # type: ignore[no-untyped-call]
            async for reply in stub.Read(p4r.ReadRequest(device_id=1, entities=cells)):
                for e in reply.entities:
                    c = e.meter_entry.config
                    held.append((e.meter_entry.index.index, c.cir, c.cburst, c.pir, c.pburst))
        return tuple(sorted(held))

    return list(await asyncio.gather(*(one(a) for a in addresses)))


async def converged_at(address: str, generation: int, timeout: float) -> float:
    """Monotonic time at which this replica answered that every DPU it holds applied `generation` (GetStatus's
    wait: one call, its own rows only, where polling 1,000 rows every 0.05 s took the replica a tenth of its loop)."""
    async with LimiterClient(address) as c:
        await c.wait_converged(timeout, generation, held_here=True)
        return time.monotonic()


async def replicated(
    url: str, replicas: int, addresses: list[str], pods: int, host_pid: int, logs: Path
) -> dict[str, object]:
    """R serve processes on `url` holding the N DPUs in P pods: the median of ROUNDS cap changes by one Apply."""
    n = len(addresses)
    ids = [f"r{i}" for i in range(1, replicas + 1)]
    procs, address = await asyncio.to_thread(start_replicas, url, ids, logs)
    try:
        plan = fleet(addresses, pods, SHARES[1], BURST_PER_DPU)
        sizes = {f"pod-{p}": sum(1 for d in plan[1] if d.pod == f"pod-{p}") for p in range(pods)}
        t0 = time.monotonic()
        async with LimiterClient(address["r1"]) as c:
            await c.apply(pods=plan[0], dpus=plan[1], caps=plan[2])
            rows = await wait_fleet(address, n, 600 + n / 10)
            first = time.monotonic() - t0
            held = "/".join(str(len(rows[r])) for r in ids)
            os.kill(host_pid, signal.SIGUSR1)  # the targets' new connections frozen, as convergence.py does
            await asyncio.sleep(1.0)
            before = await read_meters(addresses)
            changes, applies, cpus = [], [], []
            for k in range(ROUNDS):
                share = SHARES[k % 2]
                cpu = sum(cpu_s(p.pid) for p in procs.values()), cpu_s(host_pid)
                t1 = time.monotonic()
                written = await c.apply(caps={p: caps(size, share, BURST_PER_DPU) for p, size in sizes.items()})
                applies.append(time.monotonic() - t1)
                done = await asyncio.gather(*(converged_at(a, written.generation, 600) for a in address.values()))
                changes.append(max(done) - t1)
                cpus.append((sum(cpu_s(p.pid) for p in procs.values()) - cpu[0], cpu_s(host_pid) - cpu[1]))
                after = await read_meters(addresses)
                if len(set(after)) != 1 or after[0] == before[0]:
                    raise AssertionError(f"change {k}: the DPUs hold {len(set(after))} meter sets, or the old one")
                before = after
        k = changes.index(statistics.median_low(changes))
        print(
            f"pg replicas={replicas}: first convergence {first:.2f} s (held {held}); changes {fmt(changes)} s "
            f"(the Apply itself {fmt(applies)} s)",
            file=sys.stderr,
        )
        return {
            "replicas": replicas,
            "dpus": n,
            "pods": pods,
            "held": held,
            "apply_s": round(applies[k], 3),
            "converge_s": round(changes[k], 3),
            "plane_cpu_s": round(cpus[k][0], 2),
            "targets_cpu_s": round(cpus[k][1], 2),
        }
    finally:
        await asyncio.to_thread(stop_replicas, procs)


def single(addresses: list[str], host_pid: int) -> tuple[Figures, float]:
    """convergence.py's figures for one SQLite control plane, and p4runtime-shell's baseline."""
    with tempfile.TemporaryDirectory() as tmp:
        f = asyncio.run(converge(addresses, Path(tmp), host_pid))
    return f, baseline(addresses)[0]


def main() -> int:
    """Run every configuration on one set of targets and print one line of figures per configuration."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpus", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=100, help="pods the DPUs go round in the replicated runs")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--no-bracket", action="store_true", help="measure sqlite before the replicas only")
    ap.add_argument("--logs", type=Path, help="keep the replicas' logs here (default: a temporary directory)")
    args = ap.parse_args()
    logging.getLogger("finsy").setLevel(logging.CRITICAL)
    lines: list[str] = []
    singles: list[tuple[Figures, float]] = []
    pgs: list[tuple[dict[str, object], float]] = []

    def sqlite_line(f: Figures, base: float) -> str:
        return (
            f"config=sqlite dpus={args.dpus} pods=1 converge_s={f.change:.3f} floor_s={f.floor:.3f} "
            f"echo_s={f.echo:.3f} over_floor={f.change / f.floor:.2f} baseline_s={base:.3f} "
            f"ratio={base / f.change:.1f} plane_cpu_s={f.plane_cpu:.2f} targets_cpu_s={f.host_cpu:.2f} "
            f"load1={load1():.1f}"
        )

    with ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        logs.mkdir(parents=True, exist_ok=True)
        cluster = stack.enter_context(postgres.cluster())
        host, addresses, _ = start_host(args.dpus)
        try:
            singles.append(single(addresses, host.pid))
            lines.append(sqlite_line(*singles[-1]))
            print(lines[-1], file=sys.stderr)
            for r in args.replicas:
                fig = asyncio.run(replicated(cluster.database(), r, addresses, args.pods, host.pid, logs))
                pgs.append((fig, load1()))
                print(fig, file=sys.stderr)
            if not args.no_bracket:
                singles.append(single(addresses, host.pid))
                lines.append(sqlite_line(*singles[-1]))
        finally:
            stop(host, timeout=60)
    floor = statistics.mean(f.floor for f, _ in singles)
    base = statistics.mean(b for _, b in singles if not math.isnan(b)) if singles else math.nan
    for fig, load in pgs:
        conv = float(fig["converge_s"])  # type: ignore[arg-type]
        lines.append(
            " ".join(
                [f"config=pg replicas={fig['replicas']} dpus={fig['dpus']} pods={fig['pods']} held={fig['held']}"]
                + [f"apply_s={fig['apply_s']} converge_s={conv:.3f} floor_s={floor:.3f} over_floor={conv / floor:.2f}"]
                + [f"ratio={base / conv:.1f} plane_cpu_s={fig['plane_cpu_s']} targets_cpu_s={fig['targets_cpu_s']}"]
                + [f"load1={load:.1f}"]
            )
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
