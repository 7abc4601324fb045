"""Failover between replicas: how long until a dead replica's DPUs are primary elsewhere and read back.

    python bench/replica_failover.py [--dpus 100] [--pods N] [--replicas 3] [--signal KILL|TERM]
        [--replica-lease-s 6] [--backup-streams 1 [0 ...]] [--watch-s 1] [--db postgresql://...] [--profile DIR]

N embedded targets run in one helper process (bench/targets_host.py), one DPU each, in P pods (default one
pod per DPU; the DPUs go round the pods, so rendezvous hashing of pods spreads them over the replicas). R
`dpu-limiter serve` processes share one PostgreSQL database (a throwaway cluster of tests/helpers/postgres.py
unless --db names one). Once every DPU is held, converged and leased, the replica holding the most DPUs is sent
the signal (KILL: kill -9; TERM: it stops and gives its lease up). Timed from the signal until every DPU it held
shows, on a surviving replica's GetStatus, connected, primary, converged and its lease held (read back; the
survivors are polled every 0.1 s, more seldom above 4,000 DPUs). On the way, when each of those DPUs was first
seen held by a survivor (the dead replica's lease ended and a survivor started its agent: taken_s), and
connected and primary (primary_s), all from the signal. Meanwhile the lease entry of every DPU the victim held
is read over P4Runtime every second (--watch-s; each read is an RPC the targets' one process answers, so not
more often) and its deadline compared with the DPU's clock (the targets' clock origins on this host's monotonic
clock): the least time any lease had left, and how many DPUs lapsed (there should be none).

With --profile DIR, py-spy samples the targets' process and the survivors (on-CPU stacks, 100 Hz, without
stopping them) from the signal until the takeover is read back; DIR gets each one's collapsed stacks and
a summary by phase (printed to stderr too), and the replicas' logs (ID.log); the targets count the RPCs they
answer (by method) meanwhile.

With several --backup-streams values (the replicas' `--backup-streams`: 0, none; 1, the next in line keeps a
stream to each DPU), one failover per value in turn, each on a fresh database and a fresh set of targets, side by
side in one run.

A line per failover: `dpus=N pods=P replicas=R backup_streams=B signal=S moved=M taken_s=... primary_s=...
failover_s=... replica_lease_s=... least_lease_left_s=... lapsed_dpus=...`.
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
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import grpc
from finsy.proto import p4r, p4r_grpc

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.units import BACKUP_STREAMS, REPLICA_LEASE_S

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import postgres  # noqa: E402
from helpers.p4rt import lease_entry, schema  # noqa: E402
from helpers.processes import free_port, stop, wait_port  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
# Where a takeover's CPU goes: the first phase (in this order) with a key in any frame of a stack (profile()).
PHASES = [
    ("the bench's GetStatus polls", ("GetStatus", "_status_rows", "LimiterService.status")),
    ("read-back (Read)", ("_read_back", "read_raw", "P4RuntimeService.Read", "Pipeline.read")),
    ("clock echo, lease write", ("read_clock", "_on_dpu_clock", "packetio", "PacketOut", "_lease")),
    ("pipeline check", ("pipeline_digest", "_restore", "ForwardingPipelineConfig", "install")),
    ("arbitration, stream", ("p4arbitrator", "Arbitrat", "StreamChannel")),
    ("reconcile (plan, Write)", ("Codec.plan", "DpuAgent.reconcile (", "P4RuntimeService.Write", "Switch.write")),
    ("database", ("psycopg", "store_pg", "dpu_limiter/store")),
    ("placement (hashing)", ("replicas.py",)),
    ("connect, switch start", ("Switch.__init__", "DpuSwitch", "_open", "connect", "gnmi", "ports.py")),
    ("gRPC core, event loop (no Python frame of ours)", ("asyncio", "selectors", "threading", "thread.py", "cli.py")),
]


def start_host(
    n: int, calls: Path | None = None, processes: int = 1
) -> tuple[subprocess.Popen[bytes], list[str], list[int]]:
    """The targets' helper process with N targets (over `processes` processes): it, their addresses and their
    clock origins (with `calls`, counting its RPCs: SIGUSR2 writes the counts to that file)."""
    command = [sys.executable, str(ROOT / "bench" / "targets_host.py"), str(n), "--origins"]
    command += ["--processes", str(processes)]
    with ExitStack() as stack:
        err = None if calls is None else stack.enter_context(calls.open("ab"))
        host = subprocess.Popen([*command, *(["--count"] if calls else [])], stdout=subprocess.PIPE, stderr=err)
    assert host.stdout is not None
    addresses: list[str] = json.loads(host.stdout.readline())
    origins: list[int] = json.loads(host.stdout.readline())
    return host, addresses, origins


def start_replicas(
    url: str, ids: Sequence[str], logs: Path, extra: Sequence[str] = ()
) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    """`serve` processes on `url`, one per id (logs in `logs`/ID.log): the processes and API addresses by id."""
    ports = {r: free_port() for r in ids}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for r, port in ports.items():
        command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", url, "--listen", f"127.0.0.1:{port}"]
        with (logs / f"{r}.log").open("ab") as out:
            procs[r] = subprocess.Popen([*command, "--replica-id", r, *extra], stdout=out, stderr=subprocess.STDOUT)
    for r, port in ports.items():
        try:
            wait_port(port, procs[r], 60)
        except (RuntimeError, TimeoutError) as exc:
            stop_replicas(procs)
            raise RuntimeError(f"replica {r}: {exc}: {(logs / f'{r}.log').read_text()[-2000:]}") from exc
    return procs, {r: f"127.0.0.1:{p}" for r, p in ports.items()}


def stop_replicas(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM every replica still running (they stop writing and give their leases up); SIGKILL laggards."""
    for p in procs.values():  # all at once: each waits for the others' leases no longer than its own
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        stop(p, timeout=30)


def fleet(
    addresses: Sequence[str], pods: int, share_bps: float, burst: int, window_s: float = 60.0
) -> tuple[list[Pod], list[Dpu], dict[str, Cap]]:
    """P pods, DPU i in pod i mod P (parallel devices of it), each pod capped at its DPUs' count x share."""
    size = Counter(i % pods for i in range(len(addresses)))
    return (
        [Pod(f"pod-{p}", (f"10.{p // 256}.{p % 256}.0/24",)) for p in range(pods)],
        [Dpu(f"dpu-{i}", a, 1, f"pod-{i % pods}", Role.POD_UPLINK, 0, 1) for i, a in enumerate(addresses)],
        {f"pod-{p}": caps(size[p], share_bps, burst, window_s) for p in range(pods)},
    )


def caps(dpus: int, share_bps: float, burst: int, window_s: float = 60.0) -> Cap:
    """A pod's cap that gives each of its `dpus` DPUs `share_bps` each way and `burst` bytes of bucket."""
    return Cap(dpus * share_bps, dpus * share_bps, window_s, dpus * burst)


class LeaseWatch:
    """Reads every DPU's lease deadline (a P4Runtime Read: no arbitration) and its clock (from its origin)."""

    def __init__(self, addresses: list[str], origins: list[int], every: float) -> None:
        self.every = every
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
        """Sample every `every` seconds until cancelled."""
        while True:
            await asyncio.gather(*(self._one(i) for i in range(len(self.channels))), return_exceptions=True)
            await asyncio.sleep(self.every)

    async def close(self) -> None:
        """Close the channels."""
        await asyncio.gather(*(c.close() for c in self.channels))


async def held_rows(address: str) -> dict[str, object]:
    """The rows of the DPUs this replica holds (not "elsewhere"), by name."""
    async with LimiterClient(address) as c:
        st = await c.status(held_here=True)  # (every replica's whole fleet, polled, cost the survivors a quarter)
    return {d.name: d for d in st.dpus}


def good(row: object) -> bool:
    """Connected, primary, converged, lease held."""
    return bool(
        row.connected and row.primary and row.converged and row.lease_state in ("held", "renewing")  # type: ignore[attr-defined]
    )


async def wait_fleet(address: dict[str, str], n: int, timeout: float) -> dict[str, dict[str, object]]:
    """Wait until all N DPUs are held by some replica, each good; the held rows by replica."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r: await held_rows(a) for r, a in address.items()}
        by = {name: r for r, rs in rows.items() for name in rs}
        if len(by) == n and all(good(row) for rs in rows.values() for row in rs.values()):
            return rows
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fleet did not converge: {len(by)} of {n} held")
        await asyncio.sleep(0.5)


def spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid`'s on-CPU stacks at 100 Hz, without stopping it, into `out` (collapsed) until SIGINT."""
    command = [str(PY_SPY), "record", "--pid", str(pid), "--rate", "100", "--nonblocking", "--format", "raw"]
    return subprocess.Popen(
        [*command, "--duration", "600", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def profile(raw: Path) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Samples in a py-spy collapsed-stack file: in all, by phase (PHASES), and by innermost project frame."""
    total, phases, frames = 0, Counter[str](), Counter[str]()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        k = int(count)
        total += k
        names = stack.split(";")[::-1]  # innermost first
        phase = next((p for p, keys in PHASES if any(key in f for f in names for key in keys)), "other")
        phases[phase] += k
        ours = next((f for f in names if "dpu_limiter" in f or "dpu_softswitch" in f or "finsy" in f), names[0])
        frames[ours] += k
    return total, phases.most_common(), frames.most_common(12)


def report_profile(where: Path, interval: float) -> None:
    """Print each process's CPU over the takeover by phase and its busiest frames, and the RPCs the targets
    answered meanwhile (stderr; DIR/summary.txt)."""
    counts = [json.loads(line) for line in (where / "calls.json").read_text().splitlines() if line.startswith("{")]
    lines = []
    if len(counts) >= 2:
        served = Counter(counts[-1]) - Counter(counts[-2])
        lines.append("RPCs the targets answered: " + ", ".join(f"{m} {k}" for m, k in served.most_common()))
    for raw in sorted(where.glob("*.txt")):
        if raw.name == "summary.txt" or not raw.stat().st_size:
            continue
        total, phases, frames = profile(raw)
        lines.append(f"{raw.stem}: {total / 100:.2f} CPU-s sampled in {interval:.2f} s")
        lines += [f"  {v / 100:6.2f} s {100 * v / max(total, 1):4.0f} %  {p}" for p, v in phases]
        lines += [f"      {v / 100:6.2f} s  {f}" for f, v in frames]
    text = "\n".join(lines)
    (where / "summary.txt").write_text(text + "\n")
    print(text, file=sys.stderr)


async def run(
    url: str,
    n: int,
    pods: int,
    replicas: int,
    sig: signal.Signals,
    lease_s: float,
    backups: int,
    watch_s: float,
    tmp: Path,
    spy_dir: Path | None,
    processes: int = 1,
) -> dict[str, object]:
    """One failover on `url`; its figures."""
    if spy_dir is not None:
        spy_dir.mkdir(parents=True, exist_ok=True)
    host, addresses, origins = start_host(n, None if spy_dir is None else spy_dir / "calls.json", processes)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    spies: list[subprocess.Popen[bytes]] = []
    try:
        extra = ["--replica-lease-s", f"{lease_s:g}", "--backup-streams", str(backups)]
        logs = spy_dir or tmp  # the replicas' logs: kept with the profile
        procs, address = await asyncio.to_thread(
            start_replicas, url, [f"r{i}" for i in range(1, replicas + 1)], logs, extra
        )
        plan = fleet(addresses, pods, 8e6, 100_000, 10.0)
        async with LimiterClient(address["r1"]) as c:
            await c.apply(pods=plan[0], dpus=plan[1], caps=plan[2])
        rows = await wait_fleet(address, n, 600 + n / 10)
        os.kill(host.pid, signal.SIGUSR1)  # the pipelines are installed: out of the collector's reach
        victim = max(rows, key=lambda r: len(rows[r]))
        theirs = sorted(rows[victim])
        index = {f"dpu-{i}": i for i in range(n)}
        survivors = [r for r in address if r != victim]
        watch = LeaseWatch([addresses[index[d]] for d in theirs], [origins[index[d]] for d in theirs], watch_s)
        watching = asyncio.create_task(watch.run())
        await asyncio.sleep(1.0)
        every = min(0.5, max(0.1, n / 40_000))
        if spy_dir is not None:
            targets = {"targets": host.pid} | {f"survivor-{r}": procs[r].pid for r in survivors}
            spies = [spy(pid, spy_dir / f"{name}.txt") for name, pid in targets.items()]
            await asyncio.sleep(1.0)  # py-spy attached
            os.kill(host.pid, signal.SIGUSR2)
        start = time.monotonic()
        os.kill(procs[victim].pid, sig)
        print(f"{sig.name} to {victim} (held {len(theirs)}) at {time.strftime('%H:%M:%S')}", file=sys.stderr)
        taken: dict[str, float] = {}
        primary: dict[str, float] = {}
        while True:
            now = {r: await held_rows(address[r]) for r in survivors}
            at = time.monotonic() - start
            for rs in now.values():
                for name, row in rs.items():
                    taken.setdefault(name, at)
                    if row.connected and row.primary:  # type: ignore[attr-defined]
                        primary.setdefault(name, at)
            moved = {name for rs in now.values() for name, row in rs.items() if good(row)}
            if all(name in moved for name in theirs):
                took = time.monotonic() - start
                break
            if time.monotonic() - start > 300:
                raise TimeoutError(f"{len(set(theirs) - moved)} of {len(theirs)} DPUs not taken over")
            await asyncio.sleep(every)
        if spy_dir is not None:
            os.kill(host.pid, signal.SIGUSR2)
        for s in spies:
            s.send_signal(signal.SIGINT)
        for s in spies:
            s.wait(timeout=60)
        if spy_dir is not None:
            await asyncio.sleep(0.5)  # the counts written
            report_profile(spy_dir, took)
        await asyncio.sleep(2.0)  # a few more samples of the leases after the takeover
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await watch.close()
        return {
            "dpus": n,
            "pods": pods,
            "replicas": replicas,
            "backup_streams": backups,
            "signal": sig.name.removeprefix("SIG"),
            "moved": len(theirs),
            "taken_s": round(max(taken.get(d, took) for d in theirs), 2),
            "first_taken_s": round(min(taken.get(d, took) for d in theirs), 2),
            "primary_s": round(max(primary.get(d, took) for d in theirs), 2),
            "failover_s": round(took, 2),
            "replica_lease_s": lease_s,
            "least_lease_left_s": round(min(watch.least), 2),
            "lapsed_dpus": sum(1 for left in watch.least if left <= 0),
        }
    finally:
        for s in spies:
            if s.poll() is None:
                s.kill()
                s.wait(timeout=10)
        stop_replicas(procs)
        stop(host, timeout=60)


def main() -> None:
    """Parse the flags, run one failover, print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dpus", type=int, default=100)
    ap.add_argument("--pods", type=int, help="pods the DPUs go round (default: one per DPU)")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    ap.add_argument("--replica-lease-s", type=float, default=REPLICA_LEASE_S)
    ap.add_argument("--backup-streams", type=int, nargs="+", default=[BACKUP_STREAMS], metavar="N")
    ap.add_argument(
        "--target-processes",
        type=int,
        metavar="K",
        help="spread the targets over K processes (default: one per 4,000 DPUs; a process holds ~5,000 at most)",
    )
    ap.add_argument("--watch-s", type=float, default=1.0, help="seconds between reads of the moved DPUs' leases")
    ap.add_argument("--db", help="a PostgreSQL database (default: a throwaway cluster)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the targets and survivors into DIR")
    args = ap.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        cluster = None if args.db else stack.enter_context(postgres.cluster())
        for backups in args.backup_streams:
            if backups < 0:
                ap.error(f"--backup-streams: must be 0 or more, got {backups}")
            url = args.db or cluster.database()  # type: ignore[union-attr]
            figures = asyncio.run(
                run(
                    url,
                    args.dpus,
                    args.pods or args.dpus,
                    args.replicas,
                    sig,
                    args.replica_lease_s,
                    backups,
                    args.watch_s,
                    Path(tmp),
                    args.profile / f"backups-{backups}" if args.profile else None,
                    args.target_processes or -(-args.dpus // 4000),
                )
            )
            print(" ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
