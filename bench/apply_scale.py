"""One large Apply (a fleet's file) against a live control plane: how long it takes, and whether the
server keeps answering meanwhile.

    python bench/apply_scale.py [--pods 10000] [--dpus-per-pod 2] [--lease-s 0.6] [--poll-gap 0.1]

A real ControlPlane (control/dpu_limiter/server.py) runs in this process on loopback with a temp
SQLite state file and a short lease (renewed every third of it). Two helper processes (this script
again, `--role`) talk to it over real gRPC:

- the applier builds one ApplyRequest with P pods (one /24 each), P x K node DPUs (each with its
  own node MAC, all at one closed loopback port with device ids of their own: their agents just
  fail to connect) and P caps, and times the Apply call; it waits 3 s, then sends the same request
  again (nothing changes: a re-applied file) and times that too;
- the poller sends GetStatus every `--poll-gap` seconds after the last answer and records each
  call's latency. At 20,000 DPUs one GetStatus costs the server ~0.15 s of its event loop by itself
  (a row per DPU): polled that often, it is most of the stalls measured; a longer gap shows the
  Apply's own. A second poller asks for the first page of 1,000 rows (page_size), as a dashboard
  would: its figures are `*_page_max_s` and `page_idle_s`.

Here, the lease loop's renewals are timed (how much later than every lifetime / 3 each one came)
and a probe task measures how late a 10 ms sleep wakes up (the event loop's longest stall).

Figures, per phase (`apply`: the first Apply's call; `after`: the 3 s after it, while the commit's
follow-up work (agents connecting, shares being granted) runs; `again`: the re-apply's call):
wall time, the worst GetStatus latency of calls overlapping the phase, the worst lease-renewal
lateness and the worst loop stall. GetStatus itself grows with the fleet (one row per DPU), so its
median latency once the fleet is in place is printed beside (`status_idle_s`).

Last line: `pods=P dpus=D apply_s=... apply_status_max_s=... apply_lease_late_max_s=...
apply_stall_max_s=... after_status_max_s=... after_lease_late_max_s=... after_stall_max_s=...
again_s=... again_status_max_s=... again_lease_late_max_s=... again_stall_max_s=... status_idle_s=...
page_idle_s=...` (and `*_page_max_s` for each phase)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter._proto.limiter.v1 import limiter_pb2_grpc as pb_grpc
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import GRPC_MESSAGE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
AFTER_S = 3.0  # how long the follow-up phase is watched
POLL_GAP_S = 0.1  # between GetStatus calls (--poll-gap)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fleet(pods: int, per_pod: int, address: str) -> pb.ApplyRequest:
    """P pods with a /24 each, P x K node DPUs (unique node MACs and device ids), a cap per pod."""
    if pods > 65536:
        raise SystemExit("at most 65536 pods (one 10.x.y.0/24 each)")
    req = pb.ApplyRequest()
    for i in range(pods):
        name = f"pod-{i:05d}"
        req.pods.add(name=name, ipv4_prefixes=[f"10.{i // 256}.{i % 256}.0/24"])
        for j in range(per_pod):
            k = i * per_pod + j
            req.dpus.add(
                name=f"dpu-{k:06d}",
                p4runtime_address=address,
                device_id=k + 1,
                pod=name,
                role=pb.DPU_ROLE_NODE,
                host_port=0,
                uplink_port=1,
                buffer_bytes=1518,
                node_mac=f"02:00:00:{k >> 16 & 255:02x}:{k >> 8 & 255:02x}:{k & 255:02x}",
            )
        cap = pb.Cap(egress_bps=80e6 * per_pod, ingress_bps=80e6 * per_pod, window_s=1.0, burst_bytes=200_000 * per_pod)
        req.caps.add(pod=name, cap=cap)
    return req


# ---------------------------------------------------------------- helper processes


async def apply_role(address: str, pods: int, per_pod: int) -> None:
    """Send the fleet's Apply, then the same again; print each call's start and end (monotonic)."""
    req = fleet(pods, per_pod, f"127.0.0.1:{closed_port()}")
    async with grpc.aio.insecure_channel(address, options=GRPC_MESSAGE_OPTIONS) as channel:
        stub = pb_grpc.LimiterStub(channel)  # type: ignore[no-untyped-call]
        await stub.GetStatus(pb.GetStatusRequest())  # connected before the clock starts
        for phase in ("apply", "again"):
            t0 = time.monotonic()
            reply = await stub.Apply(req, timeout=600)
            t1 = time.monotonic()
            changed = sum(c.verb != "unchanged" for c in reply.changes)
            print(json.dumps({"phase": phase, "t0": t0, "t1": t1, "changed": changed}), flush=True)
            await asyncio.sleep(AFTER_S)


async def poll_role(address: str, gap_s: float, page_size: int = 0) -> None:
    """GetStatus (every DPU, or the first page of `page_size`) every `gap_s` until killed; one line per
    call: start, latency, DPUs listed."""
    async with grpc.aio.insecure_channel(address, options=GRPC_MESSAGE_OPTIONS) as channel:
        stub = pb_grpc.LimiterStub(channel)  # type: ignore[no-untyped-call]
        while True:
            t0 = time.monotonic()
            reply = await stub.GetStatus(pb.GetStatusRequest(page_size=page_size), timeout=600)
            t1 = time.monotonic()
            print(json.dumps({"t0": t0, "t1": t1, "n": len(reply.dpus)}), flush=True)
            await asyncio.sleep(gap_s)


# ---------------------------------------------------------------- the server side


def helper(role: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    """This script as a helper process, its stdout to `out`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])}
    with out.open("wb") as f:
        return subprocess.Popen([sys.executable, __file__, "--role", role, *args], stdout=f, env=env)


def worst(xs: list[float]) -> float:
    return max(xs, default=float("nan"))


async def run(pods: int, per_pod: int, lease_s: float, tmp: Path, poll_gap_s: float = POLL_GAP_S) -> dict[str, float]:
    plane = ControlPlane(tmp / "state.db", "127.0.0.1:0", settings=Settings(lease_s=lease_s))
    svc = plane.service
    renewals: list[float] = []
    renew = svc.renew_leases

    def timed_renew() -> dict[str, int]:
        renewals.append(time.monotonic())
        return renew()

    svc.renew_leases = timed_renew  # type: ignore[method-assign]
    stalls: list[tuple[float, float]] = []  # (when, how late a 10 ms sleep woke)

    async def probe() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            now = time.monotonic()
            stalls.append((now, now - t - 0.01))

    await plane.start()
    prober = asyncio.create_task(probe())
    poller = helper("poll", tmp / "poll.jsonl", "--address", plane.address, "--poll-gap", str(poll_gap_s))
    pager = helper(
        "poll", tmp / "page.jsonl", "--address", plane.address, "--poll-gap", str(poll_gap_s), "--page-size", "1000"
    )
    try:
        applier = helper(
            "apply",
            tmp / "apply.jsonl",
            "--address",
            plane.address,
            "--pods",
            str(pods),
            "--dpus-per-pod",
            str(per_pod),
        )
        while applier.poll() is None:
            await asyncio.sleep(0.1)
        if applier.returncode != 0:
            raise RuntimeError(f"the applier failed ({applier.returncode})")
    finally:
        for p in (poller, pager):
            p.terminate()
            p.wait(timeout=10)
        prober.cancel()
        await plane.stop()
    phases = {p["phase"]: p for p in map(json.loads, (tmp / "apply.jsonl").read_text().splitlines())}
    polls = [json.loads(line) for line in (tmp / "poll.jsonl").read_text().splitlines() if line.startswith("{")]
    pages = [json.loads(line) for line in (tmp / "page.jsonl").read_text().splitlines() if line.startswith("{")]
    late = [(t, t - prev - lease_s / 3) for prev, t in zip(renewals, renewals[1:], strict=False)]
    first, again = phases["apply"], phases["again"]
    windows = {
        "apply": (first["t0"], first["t1"]),
        "after": (first["t1"], first["t1"] + AFTER_S),
        "again": (again["t0"], again["t1"]),
    }
    out: dict[str, float] = {"pods": pods, "dpus": pods * per_pod}
    for name, (a, b) in windows.items():
        if name != "after":
            out[f"{name}_s"] = b - a
        out[f"{name}_status_max_s"] = worst([p["t1"] - p["t0"] for p in polls if p["t0"] < b and p["t1"] > a])
        out[f"{name}_page_max_s"] = worst([p["t1"] - p["t0"] for p in pages if p["t0"] < b and p["t1"] > a])
        # A renewal at t was due at t - lateness: late renewals count in the phase they were due in.
        out[f"{name}_lease_late_max_s"] = worst([x for t, x in late if t - x < b and t > a])
        out[f"{name}_stall_max_s"] = worst([x for t, x in stalls if t - x - 0.01 < b and t > a])
    # Once the fleet is in place and no Apply runs: between the follow-up phase and the re-apply, and after it.
    quiet = [(windows["after"][1], again["t0"]), (again["t1"], math.inf)]
    full = [p for p in polls if p["n"] == pods * per_pod]
    idle = [p["t1"] - p["t0"] for p in full if any(a < p["t0"] and p["t1"] < b for a, b in quiet)]
    out["status_idle_s"] = statistics.median(idle) if idle else float("nan")
    paged = [p["t1"] - p["t0"] for p in pages if p["n"] and any(a < p["t0"] and p["t1"] < b for a, b in quiet)]
    out["page_idle_s"] = statistics.median(paged) if paged else float("nan")
    print(f"Apply of {pods} pods, {pods * per_pod} DPUs, {pods} caps: {first['changed']} changes", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--dpus-per-pod", type=int, default=2)
    ap.add_argument("--lease-s", type=float, default=0.6, help="lease lifetime (renewed every third of it)")
    ap.add_argument("--poll-gap", type=float, default=POLL_GAP_S, help="seconds between GetStatus calls")
    ap.add_argument("--role", choices=("main", "apply", "poll"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--address", default="", help=argparse.SUPPRESS)
    ap.add_argument("--page-size", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "apply":
        asyncio.run(apply_role(args.address, args.pods, args.dpus_per_pod))
        return
    if args.role == "poll":
        asyncio.run(poll_role(args.address, args.poll_gap, args.page_size))
        return
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(run(args.pods, args.dpus_per_pod, args.lease_s, Path(tmp), args.poll_gap))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
