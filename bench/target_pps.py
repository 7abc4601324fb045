"""Forwarding rate of limiter.p4 on the embedded target and on simple_switch_grpc, side by side.

    sudo python bench/target_pps.py [--seconds 5] [--rounds 3]

Each target runs as its own process on two veth pairs this script creates (and removes), with
logging off, programmed through P4Runtime by the control plane's own code (limiter intent: a
meter far above the offered load, so every frame is forwarded). A sender floods a fixed frame mix
into port 0 from the peer interface; a receiver counts what leaves port 1. Rounds alternate
between the targets so that machine noise hits both alike. The last line is

    embedded_pps=... bmv2_pps=... ratio=...

(bmv2_pps=nan when simple_switch_grpc is not on PATH). Run it as root.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import multiprocessing as mp
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import finsy as fy
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from dpu_lab.targets import bmv2_path, bmv2_thrift_port, target_command
from dpu_limiter import dataplane as dp
from dpu_limiter.models import Cap, Dpu, Pod

ETH_P_ALL = 0x0003


def frame_mix() -> list[bytes]:
    """The fixed mix: full-size inter-pod UDP, full-size intra-pod UDP, small inter-pod UDP, ARP."""
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    return [
        bytes(eth / IP(src="10.0.1.1", dst="10.0.2.1") / UDP(sport=1, dport=2) / Raw(b"x" * 1400)),
        bytes(eth / IP(src="10.0.1.1", dst="10.0.1.2") / UDP(sport=1, dport=2) / Raw(b"x" * 1400)),
        bytes(eth / IP(src="10.0.1.1", dst="10.0.2.1") / UDP(sport=1, dport=2) / Raw(b"x" * 22)),
        bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.1.1", pdst="10.0.1.254")),
    ]


def _flood(ifname: str, seconds: float) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, ETH_P_ALL))
    mix = frame_mix()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        for _ in range(64):
            try:
                s.send(mix[i & 3])
            except OSError:
                time.sleep(0.0005)  # qdisc full: back off a little
            i += 1


def _count(ifname: str, seconds: float, out: mp.Queue[int]) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((ifname, ETH_P_ALL))
    s.settimeout(0.1)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            _, addr = s.recvfrom(65535)
        except TimeoutError:
            continue
        if addr[2] != socket.PACKET_OUTGOING:
            n += 1
    out.put(n)


async def _program(address: str) -> None:
    files = dp.limiter_program()
    dpu = Dpu("bench", address, 1, "a")
    lease = dp.Lease(1, math.inf, 10**12)  # eleven days after the target started: longer than any run
    intent = dp.intent_for(dpu, Pod("a", ("10.0.1.0/24",)), Cap(1e11, 1e11, 1.0, 1 << 30), lease)
    opts = fy.SwitchOptions(p4info=files.p4info, p4blob=files.bmv2_json, device_id=1, initial_election_id=10)
    async with fy.Switch("bench", address, opts) as sw:
        for batch in dp.Codec(sw.p4info).plan(intent, dp.NOTHING).batches():
            await sw.write(batch)


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        if proc.poll() is not None:
            raise RuntimeError(f"target exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("target did not listen")


def measure(kind: str, ifs: dict[int, tuple[str, str]], seconds: float) -> float:
    """Frames per second that `kind` forwards from port 0 to port 1 under a flood."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    thrift = bmv2_thrift_port(bmv2_path(), port) if kind == "bmv2" else None  # never bmv2's default 9090
    cmd = target_command(kind, 1, {p: sw for p, (sw, _) in ifs.items()}, f"127.0.0.1:{port}", thrift_port=thrift)  # type: ignore[arg-type]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        asyncio.run(_program(f"127.0.0.1:{port}"))
        q: mp.Queue[int] = mp.Queue()
        counter = mp.Process(target=_count, args=(ifs[1][1], seconds + 0.5, q))
        counter.start()
        time.sleep(0.3)
        sender = mp.Process(target=_flood, args=(ifs[0][1], seconds))
        sender.start()
        sender.join()
        counter.join()
        return q.get() / seconds
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    """Run the rounds and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("finsy").setLevel(logging.ERROR)  # its gNMI notice is noise here
    tag = secrets.token_hex(2)
    ifs = {p: (f"db{tag}{p}", f"db{tag}{p}p") for p in (0, 1)}
    made = []
    try:
        for sw_if, peer in ifs.values():
            subprocess.run(["ip", "link", "add", sw_if, "type", "veth", "peer", "name", peer], check=True)
            made.append(sw_if)
            for name in (sw_if, peer):
                Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
                subprocess.run(["ip", "link", "set", name, "up"], check=True)
        kinds = ["embedded"] + (["bmv2"] if shutil.which("simple_switch_grpc") else [])
        results: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                pps = measure(kind, ifs, args.seconds)
                results[kind].append(pps)
                print(f"round {r + 1} {kind}: {pps:,.0f} pps", file=sys.stderr)
        emb = statistics.median(results["embedded"])
        bm = statistics.median(results["bmv2"]) if "bmv2" in results else math.nan
        print(f"embedded_pps={emb:.0f} bmv2_pps={bm:.0f} ratio={emb / bm:.2f}")
        return 0
    finally:
        for sw_if in made:
            subprocess.run(["ip", "link", "del", sw_if], capture_output=True)


if __name__ == "__main__":
    raise SystemExit(main())
