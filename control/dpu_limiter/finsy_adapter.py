"""finsy behind one door: every use of its private API is here, on a pinned range of versions.

finsy (byllyfish/finsy) gives the control plane its P4Runtime client: connecting, arbitration,
retries, typed entities. Three things it has no public hook for are reached through its internals:

- a pipeline push on connecting (when the DPU's cookie differs) that waits for an install slot and
  says it happened, and a parsed P4Schema shared by thousands of switches: DpuSwitch overrides
  `Switch._set_pipeline`, `_set_pipeline_config_request` and `_run`, and sets `_options` and
  `_p4schema` (finsy marks Switch final);
- reads whose entities stay protobuf messages (decoding them to finsy entities only to encode them
  again costs a fleet's reconciles dearly): the switch's `_p4client.request_iter`;
- the pipeline config itself, read back and pushed again: `Switch._get_pipeline_config_request` and
  `_set_pipeline_config_request`;
- a new bid on a stream already open (a replica's backup stream taking its DPU over, `bid`): the
  switch's `_arbitrator` (its election ids and `_send`), replaced by one whose standby never asks to be
  primary on its own (`_request_primary`).

pyproject.toml pins finsy to the versions these were checked on, and tests/control/test_finsy_adapter.py
fails when a name in RELIED_ON is gone, before anything subtler does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import finsy as fy
from finsy.p4arbitrator import Arbitrator
from finsy.p4client import P4Client
from finsy.p4schema import P4ConfigResponseType
from finsy.proto import p4r

from . import dataplane as dp
from .pacing import Pacer

# (class, attribute) of finsy's that this module relies on beyond its public API.
RELIED_ON: tuple[tuple[type, str], ...] = (
    (fy.Switch, "_set_pipeline"),
    (fy.Switch, "_get_pipeline"),
    (fy.Switch, "_run"),
    (fy.Switch, "_get_pipeline_config_request"),
    (fy.Switch, "_set_pipeline_config_request"),
    (P4Client, "request_iter"),
    (Arbitrator, "_send"),
    (Arbitrator, "_request_primary"),
)
# Attributes of instances (made in their __init__) set here or read.
RELIED_ON_INSTANCE: tuple[tuple[type, tuple[str, ...]], ...] = (
    (fy.Switch, ("_options", "_p4schema", "_p4client", "_arbitrator")),
    (P4Client, ("_complete_request",)),
    (Arbitrator, ("initial_election_id", "election_id", "is_primary")),
)


@functools.cache
def schema(program: dp.ProgramFiles) -> fy.P4Schema:
    """The program's P4Schema, parsed once per process (parsing the P4Info text and hashing the
    device config takes milliseconds: thousands of agents start at once)."""
    return fy.P4Schema(program.p4info, program.bmv2_json.read_bytes())


class StandbyArbitrator(Arbitrator):  # type: ignore[misc]
    """finsy's arbitrator, except that a standby switch never asks to be primary on its own.

    finsy does when the DPU says there is no primary (simple_switch_grpc, once the primary's stream
    closes, names the highest backup primary with a lower id, which finsy takes for "none"), and bids the
    last primary's id: a holder whose stream broke and comes back with that id would find it taken, and
    stay a backup while the standby, which writes nothing, keeps the DPU until its lease lapses."""

    async def _request_primary(self, switch: fy.Switch) -> None:
        if not getattr(switch, "standby", False):
            await super()._request_primary(switch)


class DpuSwitch(fy.Switch):  # type: ignore[misc]
    """finsy's Switch, pushing its pipeline (on connecting, when the cookie differs) in an install slot,
    telling `on_install` each time a pipeline was loaded (the DPU's tables, meters and registers start
    afresh) and `on_failure` why a connection ended. Every connection attempt waits for its turn of
    `connects` (shared by a control plane's agents).

    A `standby` switch (a replica's backup stream) loads no pipeline, even when the DPU makes it primary
    (its holder gone, the highest election id left is primary): it writes nothing until it bids (`bid`).
    Nor does it fetch the DPU's P4Info as finsy's backups do (the P4Info is most of the bytes a connection
    costs the DPU, and a replica leaving makes hundreds of standbys connect at once).
    """

    def __init__(
        self,
        name: str,
        address: str,
        options: fy.SwitchOptions,
        installs: asyncio.Semaphore,
        on_failure: Callable[[Exception], None],
        program: dp.ProgramFiles,
        on_install: Callable[[], None] = lambda: None,
        connects: Pacer | None = None,
    ) -> None:
        # finsy would parse the program for every switch: each gets its own copy of one parsed schema
        # instead (a shallow copy: the P4Runtime version a switch reports is set on its own copy).
        super().__init__(name, address, dataclasses.replace(options, p4info=None, p4blob=None))
        self._options = options
        self._p4schema = copy.copy(schema(program))
        self._arbitrator = StandbyArbitrator(options.initial_election_id, options.role_name, options.role_config)
        self.installs = installs
        self.on_failure = on_failure
        self.on_install = on_install
        self.connects = connects or Pacer()
        self.standby = False

    async def _get_pipeline(self) -> None:
        if not self.standby:
            await super()._get_pipeline()

    async def _set_pipeline(self) -> None:
        if self.standby:
            return
        async with self.installs:
            await super()._set_pipeline()

    async def _set_pipeline_config_request(self, **kwargs: Any) -> p4r.SetForwardingPipelineConfigResponse:
        reply = await super()._set_pipeline_config_request(**kwargs)
        self.on_install()  # every pipeline load comes through here: on connecting, and push_pipeline
        return reply

    async def _run(self) -> None:
        # Every attempt, the first and each retry, in its turn: thousands of DPUs that failed together
        # (finsy tries again 10 s after an attempt that failed fast) come back at the pace, not at once.
        await self.connects.turn()
        try:
            await super()._run()
        except Exception as exc:  # finsy logs it and connects again: the agent's status says why meanwhile
            self.on_failure(exc)
            raise


def bid(sw: DpuSwitch, election_id: int) -> Callable[[], Awaitable[None]] | None:
    """Make the switch bid `election_id` from now on (it stops being a standby): the send of the bid on its
    open stream, to be called and awaited, or None without one (its next connection bids it).

    The DPU answers on the stream; finsy then calls the ready handler again as primary, also when the switch
    was primary already under its old id (the holder gone, a standby is the highest left): it is told it is
    not until the answer comes, and no write goes out under an id the DPU does not know yet. Everything but
    the send happens before this returns: nothing can come between."""
    arbitrator = sw._arbitrator
    arbitrator.initial_election_id = election_id  # what every later connection bids
    sw.standby = False
    if not sw.is_up:
        return None
    arbitrator.election_id = election_id
    arbitrator.is_primary = False
    send: Callable[[], Awaitable[None]] = functools.partial(arbitrator._send, sw)
    return send


def client(sw: fy.Switch) -> P4Client:
    """The switch's P4Runtime client (there while it is connected)."""
    p4client = sw._p4client
    assert p4client is not None, f"{sw.name}: not connected"
    return p4client


async def read_raw(sw: fy.Switch, request: p4r.ReadRequest) -> AsyncIterator[p4r.Entity]:
    """Each entity a Read answers, as a protobuf message."""
    async for reply in client(sw).request_iter(request):
        for entity in reply.entities:
            yield entity


def completed(sw: fy.Switch, request: p4r.WriteRequest) -> p4r.WriteRequest:
    """`request` with what the switch's own writes carry (the election id)."""
    complete = client(sw)._complete_request
    assert complete is not None
    complete(request)
    return request


async def pipeline_config(sw: fy.Switch) -> p4r.ForwardingPipelineConfig:
    """The pipeline (P4Info and device config) the DPU says it runs."""
    reply = await sw._get_pipeline_config_request(response_type=P4ConfigResponseType.ALL)
    return reply.config


async def push_pipeline(sw: fy.Switch, config: p4r.ForwardingPipelineConfig) -> None:
    """Load `config` on the DPU, whatever cookie it shows."""
    await sw._set_pipeline_config_request(config=config)
