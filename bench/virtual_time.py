"""Pod-seconds of 1 Gbit/s traffic the virtual-time lab emulates per CPU-second.

    python bench/virtual_time.py [--seconds 60] [--segment-bytes 64000] [--protocol tcp]

Two pods capped at 1 Gbit/s per direction (60 s window), each offered 2 Gbit/s of UDP toward the
other, so each pod sends at its cap: S simulated seconds are 2 x S pod-seconds of 1 Gbit/s. The
same run with MTU-sized frames (for a shorter simulated time) shows what the TSO-like segments buy.
With `--protocol tcp` each direction is one bulk TCP flow instead (tcp_model.py), under a
one-second bucket so that it runs at about the cap; its ACKs travel the other way. The last line is
`pod_seconds_per_cpu_second=... (segments of N bytes) mtu_frames=...`.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from dpu_lab.config import Scenario
from dpu_lab.virtual import VirtualLabRun

TOPOLOGY = {
    "name": "bench",
    "pods": [
        {"name": "a", "subnet": "10.0.1.0/24", "hosts": ["a1"]},
        {"name": "b", "subnet": "10.0.2.0/24", "hosts": ["b1"]},
    ],
}


def scenario(seconds: float, protocol: str = "udp") -> Scenario:
    """Two pods at their 1 Gbit/s caps in both directions for `seconds`."""
    rate = {"rate": "2G"} if protocol == "udp" else {}
    burst = {} if protocol == "udp" else {"burst_bytes": 125_000_000}  # one second: TCP needs it to reach the cap
    return Scenario.model_validate(
        {
            "name": "bench-virtual",
            "topology": TOPOLOGY,
            "caps": [{"pod": p, "egress": "1G", "ingress": "1G", "window_s": 60, **burst} for p in ("a", "b")],
            "phases": [
                {
                    "name": "at-cap",
                    "duration_s": seconds,
                    "flows": [
                        {"name": "a-to-b", "protocol": protocol, "src": "a1", "dst": "b1", **rate},
                        {"name": "b-to-a", "protocol": protocol, "src": "b1", "dst": "a1", **rate},
                    ],
                }
            ],
        }
    )


def rate(seconds: float, segment: int | None, protocol: str) -> tuple[float, bool]:
    """(pod-seconds per CPU-second, cap held) for one run."""
    with tempfile.TemporaryDirectory() as out:
        run = VirtualLabRun(scenario(seconds, protocol), Path(out), segment)
        report = run.run()
    return 2 * seconds / run.stats["cpu_s"], report.cap_held


def main() -> int:
    """Run both measurements and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--segment-bytes", type=int, default=64_000)
    ap.add_argument("--mtu-seconds", type=float, default=2.0)
    ap.add_argument("--protocol", choices=("udp", "tcp"), default="udp")
    args = ap.parse_args()
    logging.getLogger("finsy").setLevel(logging.ERROR)
    seg, seg_ok = rate(args.seconds, args.segment_bytes, args.protocol)
    mtu, mtu_ok = rate(args.mtu_seconds, None, args.protocol)
    print(
        f"segments of {args.segment_bytes} B: {seg:.1f} pod-s/CPU-s over {args.seconds:g} s (cap held: {seg_ok}); "
        f"1400 B frames: {mtu:.2f} pod-s/CPU-s over {args.mtu_seconds:g} s (cap held: {mtu_ok})"
    )
    print(f"pod_seconds_per_cpu_second={seg:.1f} segment_bytes={args.segment_bytes} mtu_frames={mtu:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
