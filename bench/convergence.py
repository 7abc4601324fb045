"""Time from a cap change to every DPU converged (read back), for 10, 100 and 1000 DPUs.

    python bench/convergence.py [--sizes 10 100 1000]

N embedded targets run in one helper process (bench/targets_host.py); the control plane runs here,
one agent per DPU, each holding its P4Runtime connection. The N DPUs are parallel devices of one
pod, so each holds an equal share of the pod's cap. After the first convergence (pipeline and
entries installed; then both processes move their setup's objects out of the garbage collector's
reach, as a long-running process would see no full collection over them), the pod's cap is changed
three times: every share from 0.5 to 1 Gbit/s, back to 0.5, and up again. Each figure is the median
of its three samples (all are printed to stderr); the machine is shared and noisy.

What each figure includes:

- converge_s: from the SetPodCap call on the control plane's API (validated, stored with one
  SQLite fsync, every DPU's agent woken) until every agent has written the new meters (one Write
  per DPU) and read them back (one Read per DPU) as the new intent. Connections are already up.
  Afterwards (not timed) every DPU's meter cells are read afresh over a separate connection and
  checked against the intent: the figure counts only if all of them hold it.
- floor_s: the same two calls per DPU with no control plane around them: each DPU's Write of its
  two meter cells (the values it already holds) and the Read a reconcile sends, prebuilt and sent
  over the control plane's own connections, all DPUs at once. It is what gRPC and the targets cost
  by themselves; converge_s / floor_s is what the control plane adds (taken after each change).
- echo_s: the same two calls per DPU (a unary one, then a server-streaming one with one reply)
  carrying the serialized requests as bytes to an echo service on the same servers, over the same
  connections: no protobuf, no P4Runtime, no target. It is what gRPC in Python costs by itself on
  both sides for this many calls on this machine (taken after each change, too).
- restart_s: after the changes, the control plane is stopped and a new one started on the same
  state file, as a supervisor restarts a crashed one: from its start until every DPU is connected,
  primary and read back as converged (its pipeline kept: the cookie matches; a new lease written).
  Not compared with anything: it is what resuming a fleet from the store takes.
- baseline_s: p4runtime-shell (needs the environment tests/softswitch/p4rt_shell/env.sh makes; otherwise
  nan) sending the same meter writes (both cells) to the same DPUs one DPU at a time, one write
  per request, without reading back: set up (connect, arbitrate, fetch the P4Info), write, tear
  down, next DPU; p4runtime-shell holds one connection at a time, so the connections are part of
  doing it one by one. The part spent in the writes alone is printed too (baseline_writes_s).

Last lines: `dpus=N converge_s=... floor_s=... echo_s=... baseline_s=... baseline_writes_s=...
ratio=... floor_ratio=... echo_ratio=... restart_s=...` (ratio = baseline_s / converge_s; floor_ratio =
baseline_s / floor_s and echo_ratio = baseline_s / echo_s, the most any P4Runtime control plane,
or any pair of Python gRPC peers at all, making these calls on this machine could reach).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import finsy as fy
import grpc
from finsy.p4client import P4Client
from finsy.proto import p4r, p4r_grpc
from grpc.aio import UnaryStreamMultiCallable, UnaryUnaryMultiCallable
from targets_host import ECHO_SERVICE

from dpu_limiter import dataplane as dp
from dpu_limiter import finsy_adapter
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Dpu, Role
from dpu_limiter.reconciler import DpuAgent
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import MeterParams

ROOT = Path(__file__).resolve().parent.parent
BURST_PER_DPU = 1_250_000  # each share's bucket (10 ms at 1 Gbit/s)
SHELL_PY = ROOT / ".venv-p4rt-shell" / "bin" / "python"
ROUNDS = 3  # cap changes (and bare-call rounds) per size; the figures are their medians


def fmt(xs: list[float]) -> str:
    """Seconds, three decimals, comma-separated."""
    return ", ".join(f"{x:.3f}" for x in xs)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Figures:
    """One size's figures (seconds)."""

    first: float  # first convergence: pipelines and entries installed
    change: float  # a cap change until every DPU read it back (median of ROUNDS)
    plane_cpu: float  # the control plane's CPU seconds during that change
    host_cpu: float  # the targets' process's CPU seconds during that change
    floor: float  # the same calls with no control plane logic (median of ROUNDS)
    echo: float  # as many gRPC calls to an echo service (median of ROUNDS)
    restart: float = math.nan  # a new control plane on the same state file until all converged


async def converge(addresses: list[str], tmp: Path, host_pid: int) -> Figures:
    """Converge N DPUs, time a cap change to all of them, then the bare calls it costs."""
    n = len(addresses)
    plane = ControlPlane(tmp / "state.db", "127.0.0.1:0", settings=Settings(rebalance_loop=False))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            t0 = time.monotonic()
            await c.apply_pod("a", ["10.0.1.0/24"])
            for i, addr in enumerate(addresses):
                await c.register_dpu(Dpu(f"dpu-{i}", addr, 1, "a", Role.POD_UPLINK, host_port=0, uplink_port=1))
            # The N DPUs are parallel devices of one pod: each holds an equal share of its cap.
            await c.set_pod_cap("a", n * 0.5e9, n * 0.5e9, 60.0, n * BURST_PER_DPU)
            await c.wait_converged(timeout=600)
            first = time.monotonic() - t0
            gc.freeze()
            os.kill(host_pid, signal.SIGUSR1)
            await asyncio.sleep(1.0)
            agents = [plane.service.agents[f"dpu-{i}"] for i in range(len(addresses))]
            changes, cpus, floors, echoes = [], [], [], []
            for k in range(ROUNDS):
                # Every share up from 0.5 to 1 Gbit/s, then down again, ... (the API takes pod caps up to 1.6 Tbit/s).
                share = 1e9 if k % 2 == 0 else 0.5e9
                cpu = cpu_s(os.getpid()), cpu_s(host_pid)
                t1 = time.monotonic()
                await c.set_pod_cap("a", n * share, n * share, 60.0, n * BURST_PER_DPU)
                # The service's own wait (event-driven), not the API's status polling, to time it finely.
                assert await plane.service.wait_converged(timeout=600)
                changes.append(time.monotonic() - t1)
                cpus.append((cpu_s(os.getpid()) - cpu[0], cpu_s(host_pid) - cpu[1]))
                await verify(addresses, [a.intent_fn()[1].meters for a in agents])
                floors.append(await bare_calls(agents))
                echoes.append(await echo_calls(agents))
            k = changes.index(statistics.median_low(changes))
            change, (plane_cpu, host_cpu) = changes[k], cpus[k]
            floor, echo = statistics.median(floors), statistics.median(echoes)
            print(
                f"dpus={n}: changes {fmt(changes)} s, bare calls {fmt(floors)} s, echo calls {fmt(echoes)} s",
                file=sys.stderr,
            )
            return Figures(first, change, plane_cpu, host_cpu, floor, echo)
    finally:
        await plane.stop()


async def restart(db: Path) -> float:
    """Seconds from starting a control plane on an existing state file until every DPU converged."""
    t0 = time.monotonic()
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(rebalance_loop=False))
    await plane.start()
    try:
        assert await plane.service.wait_converged(timeout=600)
        return time.monotonic() - t0
    finally:
        await plane.stop()


async def measure(addresses: list[str], tmp: Path, host_pid: int) -> Figures:
    """The change figures, then the restart's."""
    f = await converge(addresses, tmp, host_pid)
    f.restart = await restart(tmp / "state.db")
    return f


async def verify(addresses: list[str], meters: list[dict[int, MeterParams]]) -> None:
    """Check that every DPU's meter cells, read afresh over a new connection, hold the intent's meters."""
    program = dp.limiter_program()
    schema = fy.P4Schema(program.p4info, program.bmv2_json)
    meter_id = schema.meters[dp.METER].id
    cells = [
        p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meter_id, index=p4r.Index(index=c))) for c in dp.METER_CELLS
    ]
    limit = asyncio.Semaphore(100)

    async def check(addr: str, want: dict[int, MeterParams]) -> None:
        async with limit, grpc.aio.insecure_channel(addr) as channel:
            stub = p4r_grpc.P4RuntimeStub(channel)  # type: ignore[no-untyped-call]
            held = {}
            async for reply in stub.Read(p4r.ReadRequest(device_id=1, entities=cells)):
                for e in reply.entities:
                    c = e.meter_entry.config
                    held[e.meter_entry.index.index] = MeterParams(c.cir, c.cburst, c.pir, c.pburst)
        if held != want:
            raise AssertionError(f"{addr} holds {held}, not {want}")

    await asyncio.gather(*(check(a, m) for a, m in zip(addresses, meters, strict=True)))


def prebuilt_calls(agents: list[DpuAgent]) -> list[tuple[P4Client, p4r.WriteRequest, p4r.ReadRequest]]:
    """Each DPU's Write (meters as held) and Read as a reconcile sends them, with the agent's client."""
    calls = []
    for a in agents:
        codec = a.codec
        assert codec is not None
        meters = sorted(a.intent_fn()[1].meters.items())
        entities = [p4r.Entity(meter_entry=codec.meter(cell, m)) for cell, m in meters]
        updates = [p4r.Update(type=p4r.Update.MODIFY, entity=e) for e in entities]
        # The election id, as the agent's own writes get it.
        write = finsy_adapter.completed(a.switch, p4r.WriteRequest(device_id=a.dpu.device_id, updates=updates))
        read = p4r.ReadRequest(device_id=a.dpu.device_id, entities=codec.reads)
        calls.append((finsy_adapter.client(a.switch), write, read))
    return calls


async def bare_calls(agents: list[DpuAgent]) -> float:
    """Seconds for every DPU's Write (meters as held) and Read, prebuilt, over the agents' connections."""
    calls = prebuilt_calls(agents)

    async def one(client: P4Client, write: p4r.WriteRequest, read: p4r.ReadRequest) -> None:
        await client.request(write)
        async for _ in client.request_iter(read):
            pass

    t0 = time.monotonic()
    await asyncio.gather(*(one(*c) for c in calls))
    return time.monotonic() - t0


async def echo_calls(agents: list[DpuAgent]) -> float:
    """Seconds for the same two calls per DPU as bytes to the targets' echo service: gRPC by itself."""
    calls = []
    for client, write, read in prebuilt_calls(agents):
        assert client.channel is not None
        unary = client.channel.unary_unary(f"/{ECHO_SERVICE}/Unary")
        stream = client.channel.unary_stream(f"/{ECHO_SERVICE}/Stream")
        calls.append((unary, write.SerializeToString(), stream, read.SerializeToString()))

    async def one(unary: UnaryUnaryMultiCallable, w: bytes, stream: UnaryStreamMultiCallable, r: bytes) -> None:
        await unary(w)
        async for _ in stream(r):
            pass

    t0 = time.monotonic()
    await asyncio.gather(*(one(*c) for c in calls))
    return time.monotonic() - t0


def baseline(addresses: list[str]) -> tuple[float, float]:
    """Seconds p4runtime-shell takes to send the same meter writes one DPU at a time: in all, in the writes."""
    if not SHELL_PY.exists():
        return math.nan, math.nan
    res = subprocess.run(
        [str(SHELL_PY), str(ROOT / "bench" / "p4rt_shell_writes.py"), "250000000", "25000000", *addresses],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
        return math.nan, math.nan
    total, writes = res.stdout.strip().splitlines()[-2:]
    return float(total), float(writes)


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
                f = asyncio.run(measure(addresses, Path(tmp), host.pid))
            base, base_writes = baseline(addresses)
        finally:
            host.terminate()
            host.wait(timeout=30)
        print(
            f"dpus={n}: first convergence {f.first:.2f} s, cap change converged in {f.change:.3f} s "
            f"(CPU: control plane {f.plane_cpu:.2f} s, targets {f.host_cpu:.2f} s), "
            f"the bare calls {f.floor:.3f} s, as many echo calls {f.echo:.3f} s, "
            f"p4runtime-shell one by one {base:.3f} s (of which writing {base_writes:.3f} s); "
            f"a restarted control plane converged in {f.restart:.2f} s",
            file=sys.stderr,
        )
        lines.append(
            f"dpus={n} converge_s={f.change:.3f} floor_s={f.floor:.3f} echo_s={f.echo:.3f} baseline_s={base:.3f} "
            f"baseline_writes_s={base_writes:.3f} ratio={base / f.change:.1f} floor_ratio={base / f.floor:.1f} "
            f"echo_ratio={base / f.echo:.1f} restart_s={f.restart:.2f}"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
