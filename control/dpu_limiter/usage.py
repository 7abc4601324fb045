"""Usage rows: what a pod (or one DPU) sent or received across its boundary, from the DPUs' counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DirectionUsage:
    """Bytes and packets one pod sent or received across its boundary, by class and colour."""

    pod: str
    direction: str
    exempt_bytes: int
    metered_bytes: int
    green_bytes: int
    yellow_bytes: int
    red_bytes: int
    other_bytes: int
    fragment_bytes: int
    metered_packets: int
    red_packets: int
    window_bytes: int  # dropped over the window budget
    lease_bytes: int  # dropped for want of a valid lease
    spoofed_bytes: int  # dropped: IPv4 from inside the pod with a source outside it
    intra_bytes: int = 0  # of exempt_bytes: IPv4 between nodes of the pod (node DPUs only)
    arp_bytes: int = 0  # of exempt_bytes: well-formed minimum-size ARP that ARP's own meter passed
    arp_dropped_bytes: int = 0  # dropped: ARP over its own allowance
    dpu: str = ""  # empty: the pod's totals; else the one DPU these counters are from
    dpus_unread: int = 0  # a pod's totals: how many of its DPUs' counters could not be read (left out)
    error: str = ""  # a DPU's row: why its counters could not be read (the row is then all zeros)


def usage_row(pod: str, dpu: str, direction: str, reads: list[dict[str, dict[str, tuple[int, int]]]]) -> DirectionUsage:
    """One row of usage: `reads` (DPUs' counter cells) summed for `direction`."""
    tot: dict[str, list[int]] = {}
    for r in reads:
        for k, (npk, nby) in r[direction].items():
            acc = tot.setdefault(k, [0, 0])
            acc[0] += npk
            acc[1] += nby

    def b(k: str) -> int:
        return tot.get(k, [0, 0])[1]

    def pk(k: str) -> int:
        return tot.get(k, [0, 0])[0]

    return DirectionUsage(
        pod=pod,
        direction=direction,
        exempt_bytes=b("intra") + b("arp") - b("arp_red"),
        metered_bytes=b("ipv4") + b("fragment") + b("other"),
        green_bytes=b("green"),
        yellow_bytes=b("yellow"),
        red_bytes=b("red"),
        other_bytes=b("other"),
        fragment_bytes=b("fragment"),
        metered_packets=pk("ipv4") + pk("fragment") + pk("other"),
        red_packets=pk("red"),
        window_bytes=b("window"),
        lease_bytes=b("lease"),
        spoofed_bytes=b("spoofed"),
        intra_bytes=b("intra"),
        arp_bytes=b("arp") - b("arp_red"),  # the class counts ARP before its meter drops any
        arp_dropped_bytes=b("arp_red"),
        dpu=dpu,
    )
