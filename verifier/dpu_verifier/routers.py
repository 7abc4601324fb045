"""The routers' own byte counts, read over SNMP: IF-MIB's 64-bit octet counters of the ports where
pods' uplinks land. The operator's DPUs cannot change these; the verifier's cap check and its balance
against the DPUs rest on them.

A router port faces one pod: what the router receives on it (ifHCInOctets) left the pod (its egress),
what it sends out of it (ifHCOutOctets) entered the pod (its ingress). Counters are read as deltas
between polls; a poll whose counters cannot be trusted to continue the last one (the agent restarted:
sysUpTime went back; the interface's ifCounterDiscontinuityTime changed; the port's ifIndex now names
another interface) gives no delta for that port (None: unsure, as a DPU that restarted), and counting
resumes from the next. A 64-bit counter that goes back with no discontinuity wrapped (RFC 2863).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    get_cmd,
    walk_cmd,
)

SYS_UPTIME = "1.3.6.1.2.1.1.3.0"
IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"
IF_HC_IN_OCTETS = "1.3.6.1.2.1.31.1.1.1.6"
IF_HC_OUT_OCTETS = "1.3.6.1.2.1.31.1.1.1.10"
IF_COUNTER_DISCONTINUITY = "1.3.6.1.2.1.31.1.1.1.19"
WRAP = 1 << 64
TIMEOUT_S = 1.0
RETRIES = 2


class SnmpError(Exception):
    """A router that did not answer, or answered with an error, named with what was asked."""


@dataclass(frozen=True)
class PortReading:
    """One port's counters at one poll, with what tells whether they continue the last poll's."""

    name: str
    in_octets: int
    out_octets: int
    discontinuity: int  # ifCounterDiscontinuityTime (hundredths of a second of sysUpTime)


@dataclass
class PortCounter:
    """A port's counts since the verifier began, from successive readings (see the module's docstring)."""

    name: str
    _last: PortReading | None = None
    _uptime: int = -1

    def advance(self, reading: PortReading | None, uptime: int) -> tuple[int, int] | None:
        """The bytes (received, sent) since the last reading; None when they cannot be known (the first
        reading, a missing one, or a discontinuity)."""
        last, last_uptime = self._last, self._uptime
        self._last, self._uptime = reading, uptime
        if reading is None or last is None or uptime < last_uptime:
            return None
        if reading.name != last.name or reading.discontinuity != last.discontinuity:
            return None
        return (reading.in_octets - last.in_octets) % WRAP, (reading.out_octets - last.out_octets) % WRAP


@dataclass
class SnmpRouter:
    """One router's SNMP agent (SNMPv2c, read-only community) and the ports the verifier reads on it, by
    interface name (ifName), each facing one pod."""

    host: str
    port: int
    community: str
    ports: dict[str, str]  # ifName -> pod
    _engine: SnmpEngine = field(default_factory=SnmpEngine)
    _index: dict[str, int] = field(default_factory=dict)  # ifName -> ifIndex, as last walked

    async def _target(self) -> UdpTransportTarget:
        return await UdpTransportTarget.create((self.host, self.port), timeout=TIMEOUT_S, retries=RETRIES)

    def _where(self) -> str:
        return f"router {self.host}:{self.port}"

    async def _walk_names(self) -> dict[str, int]:
        names: dict[str, int] = {}
        target = await self._target()
        auth = CommunityData(self.community, mpModel=1)
        async for err, status, _, binds in walk_cmd(
            self._engine, auth, target, ContextData(), ObjectType(ObjectIdentity(IF_NAME)), lexicographicMode=False
        ):
            if err or status:
                raise SnmpError(f"{self._where()}: walking ifName: {err or status.prettyPrint()}")
            for oid, value in binds:
                names[str(value)] = int(str(oid).rsplit(".", 1)[1])
        return names

    async def read(self) -> tuple[int, dict[str, PortReading | None]]:
        """sysUpTime, and each port's reading (None: the router has no interface of that name now)."""
        if not self._index or any(n not in self._index for n in self.ports):
            self._index = await self._walk_names()
        names = [n for n in self.ports if n in self._index]
        oids = [SYS_UPTIME]
        for n in names:
            i = self._index[n]
            oids += [
                f"{IF_NAME}.{i}",
                f"{IF_HC_IN_OCTETS}.{i}",
                f"{IF_HC_OUT_OCTETS}.{i}",
                f"{IF_COUNTER_DISCONTINUITY}.{i}",
            ]
        err, status, _, binds = await get_cmd(
            self._engine,
            CommunityData(self.community, mpModel=1),
            await self._target(),
            ContextData(),
            *(ObjectType(ObjectIdentity(o)) for o in oids),
        )
        if err or status:
            raise SnmpError(f"{self._where()}: reading counters: {err or status.prettyPrint()}")
        values = [v for _, v in binds]
        uptime = int(values[0])
        out: dict[str, PortReading | None] = dict.fromkeys(self.ports)
        for k, n in enumerate(names):
            name, rx, tx, disc = values[1 + 4 * k : 5 + 4 * k]
            try:
                reading = PortReading(str(name), int(rx), int(tx), int(disc))
            except (TypeError, ValueError):  # noSuchInstance: the interface went away since the walk
                continue
            out[n] = reading if reading.name == n else None  # its ifIndex names another interface now
        if any(r is None for r in out.values()):
            self._index = {}  # walk again next time: an interface came or went, or ifIndexes moved
        return uptime, out
