"""`python -m dpu_lab.offload IFNAME...`: turn off checksum/segmentation offloads (ethtool -K, via pyroute2)."""

from __future__ import annotations

import sys

from pyroute2.ethtool import Ethtool

OFF = (
    "tx-checksum-ip-generic",
    "tx-checksum-ipv4",
    "tx-checksum-ipv6",
    "tx-checksum-sctp",
    "tx-scatter-gather",
    "tx-tcp-segmentation",
    "tx-tcp6-segmentation",
    "tx-generic-segmentation",
    "rx-gro",
    "tx-udp-segmentation",
    # VLAN tags stripped on receive (rx) or added late on send (tx) would hide them from a software
    # switch reading a raw socket: a tagged frame would be classified as untagged.
    "rx-vlan-hw-parse",
    "tx-vlan-hw-insert",
    "rx-vlan-stag-hw-parse",
    "tx-vlan-stag-hw-insert",
)


def offloads_off(ifname: str) -> None:
    """Disable the offload features of `ifname` that a software switch cannot handle."""
    with Ethtool() as et:
        features = et.get_features(ifname)
        for name in OFF:
            feat = features.features.get(name)
            if feat is not None and feat.enable and feat.available:
                feat.enable = False
        et.set_features(ifname, features)


def main(argv: list[str]) -> int:
    """Disable offloads on each named interface."""
    if not argv:
        print("usage: python -m dpu_lab.offload IFNAME...", file=sys.stderr)
        return 2
    for ifname in argv:
        offloads_off(ifname)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
