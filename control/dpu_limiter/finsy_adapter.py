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
  `_set_pipeline_config_request`.

pyproject.toml pins finsy to the versions these were checked on, and tests/control/test_finsy_adapter.py
fails when a name in RELIED_ON is gone, before anything subtler does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import finsy as fy
from finsy.p4client import P4Client
from finsy.p4schema import P4ConfigResponseType
from finsy.proto import p4r

from . import dataplane as dp
from .pacing import Pacer

# (class, attribute) of finsy's that this module relies on beyond its public API.
RELIED_ON: tuple[tuple[type, str], ...] = (
    (fy.Switch, "_set_pipeline"),
    (fy.Switch, "_run"),
    (fy.Switch, "_get_pipeline_config_request"),
    (fy.Switch, "_set_pipeline_config_request"),
    (P4Client, "request_iter"),
)
# Attributes of instances (made in their __init__) set here or read.
RELIED_ON_INSTANCE: tuple[tuple[type, tuple[str, ...]], ...] = (
    (fy.Switch, ("_options", "_p4schema", "_p4client")),
    (P4Client, ("_complete_request",)),
)


@functools.cache
def schema(program: dp.ProgramFiles) -> fy.P4Schema:
    """The program's P4Schema, parsed once per process (parsing the P4Info text and hashing the
    device config takes milliseconds: thousands of agents start at once)."""
    return fy.P4Schema(program.p4info, program.bmv2_json.read_bytes())


class DpuSwitch(fy.Switch):  # type: ignore[misc]
    """finsy's Switch, pushing its pipeline (on connecting, when the cookie differs) in an install slot,
    telling `on_install` each time a pipeline was loaded (the DPU's tables, meters and registers start
    afresh) and `on_failure` why a connection ended. Every connection attempt waits for its turn of
    `connects` (shared by a control plane's agents)."""

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
        self.installs = installs
        self.on_failure = on_failure
        self.on_install = on_install
        self.connects = connects or Pacer()

    async def _set_pipeline(self) -> None:
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
