"""The DPUs as the control plane's API shows them (checks.DeviceView): one control plane, or the replicas
of one (docs/replicas.md), each of which reads only the DPUs it holds back and counts.

With replicas, every replica lists every DPU, and says of one held elsewhere that it is (lease state
"elsewhere", its usage row unread, naming the holder); the view asks every replica it is given and takes
each DPU's figures from the one that holds it, so a verifier pointed at one replica alone is not left with
every other replica's DPUs unread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dpu_limiter.client import LimiterClient, Status, Usage

from .checks import Facts

ELSEWHERE = "elsewhere"  # a replica's lease state for a DPU another replica holds


@dataclass
class ApiView:
    """The DPUs through the control plane's API: `address`, and its other replicas' (`replicas`), if any."""

    address: str
    replicas: tuple[str, ...] = ()
    _drift: dict[tuple[str, str], int] = field(default_factory=dict)  # (replica, DPU) -> corrections seen

    def _addresses(self) -> tuple[str, ...]:
        return (self.address, *self.replicas)

    async def _status(self) -> list[tuple[str, Status]]:
        """Every replica's GetStatus, with its address."""

        async def one(address: str) -> tuple[str, Status]:
            async with LimiterClient(address) as client:
                return address, await client.status()

        return list(await asyncio.gather(*(one(a) for a in self._addresses())))

    async def facts(self) -> Facts:
        """The control plane's pipeline, the DPUs' as read back (by whoever holds each), its change log's head."""
        async with LimiterClient(self.address) as client:
            dpus = await client.list_dpus()
        answers = await self._status()
        status = answers[0][1]
        read: dict[str, str] = {}
        for _, st in answers:
            read.update({d.name: d.pipeline_sha256 for d in st.dpus if d.lease_state != ELSEWHERE})
        pipelines: dict[str, dict[str, str]] = {}
        buffers: dict[str, int] = {}
        for d in dpus:
            pipelines.setdefault(d.pod, {})[d.name] = read.get(d.name, "")
            buffers[d.pod] = buffers.get(d.pod, 0) + d.buffer_bytes
        head = (status.change_log_seq, status.change_log_hash)
        return Facts(status.expected_pipeline_sha256, pipelines, head, buffers)

    async def read_back(self) -> list[tuple[str, str]]:
        """New drift corrections of the control plane's periodic read-back, per DPU (by whoever holds it)."""
        found = []
        for address, status in await self._status():
            for d in status.dpus:
                if d.lease_state == ELSEWHERE:
                    continue
                if d.drift_corrections > self._drift.get((address, d.name), 0):
                    found.append((d.name, d.last_drift.partition(": ")[2] or d.last_drift))
                self._drift[(address, d.name)] = d.drift_corrections
        return found

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Each DPU's counters (None where no replica could read them): per DPU, so that one that restarted
        is seen going back even while its pod's total still rises."""

        async def one(address: str) -> Usage:
            async with LimiterClient(address) as client:
                return await client.usage(per_dpu=True)

        rows: dict[tuple[str, str], tuple[str, tuple[int, int] | None]] = {}  # (DPU, direction) -> pod, bytes
        for usage in await asyncio.gather(*(one(a) for a in self._addresses())):
            for u in usage.usage:
                if not u.dpu or (u.error and (u.dpu, u.direction) in rows):
                    continue  # a pod's totals (its DPUs' rows follow), or unread here where another read it
                if u.error:
                    rows[(u.dpu, u.direction)] = (u.pod, None)
                    continue
                # ARP has a meter of its own (arp_bytes: what it passed).
                if u.direction == "egress":
                    n = u.green_bytes + u.yellow_bytes + u.arp_bytes
                else:
                    n = u.green_bytes + u.yellow_bytes + u.red_bytes + u.window_bytes + u.lease_bytes + u.arp_bytes
                    n += u.arp_dropped_bytes
                rows[(u.dpu, u.direction)] = (u.pod, (n, 0))
        out: dict[str, tuple[str, tuple[int, int] | None]] = {}
        for (name, direction), (pod, read) in rows.items():
            _, got = out.get(name, (pod, (0, 0)))
            if read is None or got is None:
                out[name] = (pod, None)
                continue
            passed, metered = got
            out[name] = (pod, (passed + read[0], metered) if direction == "egress" else (passed, metered + read[0]))
        return out
