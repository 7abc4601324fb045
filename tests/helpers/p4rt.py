"""Raw P4Runtime helpers shared by the tests: a client with its own stream and election id, limiter.p4's
pipeline and entries, and test frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from finsy.proto import p4r, p4r_grpc
from google.protobuf import text_format
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from dpu_softswitch.server import Device
from helpers.paths import BMV2_JSON, P4INFO

A_HOST, B_HOST = "10.0.1.1", "10.0.2.1"
PEERS = "LimiterIngress.pod_peers"
ARP_CELLS = 256  # limiter.p4: boundary_meter cell ARP_CELLS + c is cell c's ARP meter


def config() -> p4r.ForwardingPipelineConfig:
    cfg = p4r.ForwardingPipelineConfig(p4_device_config=BMV2_JSON.read_bytes())
    text_format.Parse(P4INFO.read_text(), cfg.p4info)
    cfg.cookie.cookie = 42
    return cfg


@dataclass
class Client:
    """A raw P4Runtime client: one stream, one election id."""

    stub: p4r_grpc.P4RuntimeStub
    election_id: int
    responses: asyncio.Queue[p4r.StreamMessageResponse]
    requests: asyncio.Queue[p4r.StreamMessageRequest | None]
    call: object

    def eid(self) -> p4r.Uint128:
        return p4r.Uint128(high=0, low=self.election_id)

    async def write(self, *updates: p4r.Update) -> None:
        await self.stub.Write(p4r.WriteRequest(device_id=1, election_id=self.eid(), updates=list(updates)))

    async def set_pipeline(self, cfg: p4r.ForwardingPipelineConfig) -> None:
        await self.stub.SetForwardingPipelineConfig(
            p4r.SetForwardingPipelineConfigRequest(
                device_id=1,
                election_id=self.eid(),
                action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
                config=cfg,
            )
        )

    async def read(self, *entities: p4r.Entity) -> list[p4r.Entity]:
        out: list[p4r.Entity] = []
        async for resp in self.stub.Read(p4r.ReadRequest(device_id=1, entities=list(entities))):
            out.extend(resp.entities)
        return out


async def connect(channel: grpc.aio.Channel, election_id: int) -> Client:
    stub = p4r_grpc.P4RuntimeStub(channel)  # type: ignore[no-untyped-call]
    requests: asyncio.Queue[p4r.StreamMessageRequest | None] = asyncio.Queue()
    responses: asyncio.Queue[p4r.StreamMessageResponse] = asyncio.Queue()

    async def gen() -> AsyncIterator[p4r.StreamMessageRequest]:
        while (item := await requests.get()) is not None:
            yield item

    call = stub.StreamChannel(gen())

    async def pump() -> None:
        async for msg in call:
            responses.put_nowait(msg)

    asyncio.get_running_loop().create_task(pump())
    c = Client(stub, election_id, responses, requests, call)
    req = p4r.StreamMessageRequest()
    req.arbitration.device_id = 1
    req.arbitration.election_id.CopyFrom(c.eid())
    requests.put_nowait(req)
    return c


def table_entry(
    pipeline_p4info: object,
    table: str,
    action: str,
    match: dict[str, object],
    params: dict[str, int],
) -> p4r.Entity:
    from finsy import P4Schema, P4TableAction, P4TableEntry, P4TableMatch

    assert isinstance(pipeline_p4info, P4Schema)
    return P4TableEntry(table, match=P4TableMatch(match), action=P4TableAction(action, **params)).encode(
        pipeline_p4info
    )


def schema() -> object:
    from finsy import P4Schema

    return P4Schema(P4INFO, BMV2_JSON)


def update(kind: int, entity: p4r.Entity) -> p4r.Update:
    return p4r.Update(type=kind, entity=entity)  # type: ignore[arg-type]


LONG_LEASE_US = 10**12  # eleven days after the target started: a lease that outlives any test


def lease_entry(sch: object, gen: int, deadline_us: int) -> p4r.Entity:
    """lease_cfg's default action: lease `gen` until `deadline_us` on the target's clock."""
    from finsy import P4Schema, P4TableAction, P4TableEntry

    assert isinstance(sch, P4Schema)
    action = P4TableAction("LimiterIngress.lease", gen=gen, deadline=deadline_us, epoch=0)
    return P4TableEntry("LimiterIngress.lease_cfg", action=action, is_default_action=True).encode(sch)


def lease_deadline_us(device: Device) -> int:
    """The deadline of the lease an embedded target holds (us, on its own clock; 0: none)."""
    pipeline = device.pipeline
    if pipeline is None:
        return 0
    [entity] = pipeline.read(lease_entry(schema(), 0, 0))
    params = {p.param_id: int.from_bytes(p.value, "big") for p in entity.table_entry.action.action.params}
    return params.get(2, 0)


def lease_left_us(device: Device) -> int:
    """How long the lease an embedded target holds runs on (us, on its own clock; <= 0: lapsed or none)."""
    return lease_deadline_us(device) - device.clock.now_us() if device.pipeline is not None else 0


SEAL_PORT = 2  # a node DPU's crypto engine, in program_limiter
NODE_MAC = "02:00:00:00:00:01"  # the node's own MAC there: udp()'s source


async def program_limiter(
    c: Client, rate_bytes_s: int, burst: int, peers: tuple[str, ...] = (), arp: tuple[int, int] | None = None
) -> object:
    """Pipeline, meter (both cells), a long lease, exemption prefix of pod a, boundary 0<->1; with
    `peers`, those MACs as pod peers and a crypto engine on SEAL_PORT (a node DPU's: intra-pod frames
    from port 0 leave by SEAL_PORT, and only those arriving by it are intra-pod); with `arp` =
    (bytes/s, burst), ARP's meters (else unconfigured: they pass everything, as bmv2's do)."""
    from finsy import P4MeterConfig, P4MeterEntry

    sch = schema()
    await c.set_pipeline(config())
    cfg = P4MeterConfig(cir=rate_bytes_s, cburst=burst, pir=rate_bytes_s, pburst=burst)
    cells = [(cell, cfg) for cell in (0, 1)]
    if arp is not None:
        arp_cfg = P4MeterConfig(cir=arp[0], cburst=arp[1], pir=arp[0], pburst=arp[1])
        cells += [(ARP_CELLS + cell, arp_cfg) for cell in (0, 1)]
    for cell, mc in cells:
        await c.write(
            update(p4r.Update.MODIFY, P4MeterEntry("LimiterIngress.boundary_meter", index=cell, config=mc).encode(sch))
        )  # type: ignore[arg-type]
    for mac in peers:
        await c.write(update(p4r.Update.INSERT, table_entry(sch, PEERS, "NoAction", {"meta.peer_mac": mac}, {})))
    if peers:
        port_key = "standard_metadata.ingress_port"
        sealing = "LimiterIngress.sealing"
        await c.write(
            update(
                p4r.Update.INSERT,
                table_entry(
                    sch, sealing, "LimiterIngress.seal_via", {port_key: 0}, {"port": SEAL_PORT, "node_mac": NODE_MAC}
                ),
            ),
            update(
                p4r.Update.INSERT,
                table_entry(sch, sealing, "LimiterIngress.opened", {port_key: SEAL_PORT}, {"node_mac": NODE_MAC}),
            ),
            update(
                p4r.Update.INSERT,
                table_entry(
                    sch,
                    "LimiterIngress.boundary",
                    "LimiterIngress.cross",
                    {port_key: SEAL_PORT},
                    {"port": 0, "cell": 1, "inside": 0},
                ),
            ),
        )
    await c.write(update(p4r.Update.MODIFY, lease_entry(sch, 1, LONG_LEASE_US)))
    ins = p4r.Update.INSERT
    await c.write(
        update(ins, table_entry(sch, "LimiterIngress.src_in_pod", "NoAction", {"hdr.ipv4.srcAddr": "10.0.1.0/24"}, {})),
        update(ins, table_entry(sch, "LimiterIngress.dst_in_pod", "NoAction", {"hdr.ipv4.dstAddr": "10.0.1.0/24"}, {})),
        update(
            ins,
            table_entry(
                sch,
                "LimiterIngress.boundary",
                "LimiterIngress.cross",
                {"standard_metadata.ingress_port": 0},
                {"port": 1, "cell": 0, "inside": 1},
            ),
        ),
        update(
            ins,
            table_entry(
                sch,
                "LimiterIngress.boundary",
                "LimiterIngress.cross",
                {"standard_metadata.ingress_port": 1},
                {"port": 0, "cell": 1, "inside": 0},
            ),
        ),
    )
    return sch


def udp(src: str, dst: str, size: int = 1000) -> bytes:
    return bytes(
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src=src, dst=dst)
        / UDP(sport=1000, dport=2000)
        / Raw(b"x" * size)
    )


def detail_codes(err: grpc.aio.AioRpcError) -> list[int]:
    """The canonical code of each update in a failed Write's status details."""
    from finsy.proto import rpc_status

    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            status = rpc_status.Status.FromString(value)
            codes = []
            for d in status.details:
                e = p4r.Error()
                d.Unpack(e)
                codes.append(e.canonical_code)
            return codes
    raise AssertionError("no status details")
