"""The device's own management path beside P4Runtime: what compromised firmware on a DPU can do.

A DPU runs software of its own (on BlueField, Arm cores beside the packet pipeline) that can change
the pipeline with no controller's arbitration and no trace in P4Runtime. The lab models an attacker
in that position. In process, `LocalFirmware(device)`; for a dpu_softswitch process started with
`--firmware-socket PATH`, `FirmwareClient(PATH)` over a Unix socket (mode 0600) that takes one JSON
line per request and answers one JSON line ({"error": ...} on failure):

    {"op": "p4info"}                                -> {"p4info": B64}   the honest pipeline's P4Info
    {"op": "read", "entity": B64}                   -> {"entities": [B64, ...]}
    {"op": "write", "updates": [B64, ...], "forge": bool}  -> {}
    {"op": "load", "config": B64, "forge": bool}   -> {}

B64 is a base64 P4Runtime message (P4Info, Entity, Update, ForwardingPipelineConfig). Without
`forge` the changes go to the pipeline P4Runtime sees; with it, to a copy that packets take while
P4Runtime keeps reading and writing the honest one (Device.data_plane): the firmware lies.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from finsy.proto import p4i, p4r

from .device import Device
from .runtime.pipeline import Pipeline
from .runtime.profile_mgr import MANUAL


class Firmware(Protocol):
    """What compromised firmware can do to its device."""

    def p4info(self) -> p4i.P4Info:
        """The P4Info of the pipeline P4Runtime sees."""

    def read(self, entity: p4r.Entity) -> list[p4r.Entity]:
        """Read the pipeline P4Runtime sees, as a P4Runtime read would."""

    def write(self, updates: list[p4r.Update], forge: bool) -> None:
        """Apply updates with no arbitration (to a copy packets take, with `forge`)."""

    def load(self, config: p4r.ForwardingPipelineConfig, forge: bool) -> None:
        """Replace the pipeline (only the one packets take, with `forge`)."""


class LocalFirmware:
    """Firmware acting on an in-process Device."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def _honest(self) -> Pipeline:
        if self.device.pipeline is None:
            raise ValueError(f"device {self.device.device_id} has no pipeline to tamper with")
        return self.device.pipeline

    def p4info(self) -> p4i.P4Info:
        """The P4Info of the pipeline P4Runtime sees."""
        with self.device.lock:
            return self._honest().p4info

    def read(self, entity: p4r.Entity) -> list[p4r.Entity]:
        """Read the pipeline P4Runtime sees."""
        with self.device.lock:
            return list(self._honest().read(entity))

    def write(self, updates: list[p4r.Update], forge: bool) -> None:
        """Apply updates with no arbitration (to a copy packets take, with `forge`)."""
        with self.device.lock:
            honest = self._honest()
            # Forging again tampers further with the copy that already lies.
            target = (self.device.data_plane or clone(self.device, honest)) if forge else honest
            for update in updates:
                target.write(update)
            if forge:
                self.device.data_plane = target

    def load(self, config: p4r.ForwardingPipelineConfig, forge: bool) -> None:
        """Replace the pipeline (only the one packets take, with `forge`)."""
        with self.device.lock:
            other = self.device.build_pipeline(config)
            if forge:
                self.device.data_plane = other
            else:
                self.device.pipeline = other


def clone(device: Device, honest: Pipeline, registers: bool = True) -> Pipeline:
    """A second pipeline of the same program holding the same entries, meters and (unless not
    `registers`) registers: without them, what firmware that restores its tables from flash after a
    restart comes back with."""
    config = p4r.ForwardingPipelineConfig(p4info=honest.p4info, p4_device_config=honest.device_config)
    config.cookie.cookie = honest.cookie
    copy = device.build_pipeline(config)
    _clone_profiles(honest, copy)
    for entity in honest.read(p4r.Entity(table_entry=p4r.TableEntry())):
        copy.write(p4r.Update(type=p4r.Update.INSERT, entity=entity))
    for t in honest.p4info.tables:  # default actions (the lease among them): a wildcard read leaves them out
        if t.implementation_id:  # tables with an action profile have no default action to set
            continue
        default = p4r.TableEntry(table_id=t.preamble.id, is_default_action=True)
        for entity in honest.read(p4r.Entity(table_entry=default)):
            if not t.const_default_action_id:
                copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    for m in honest.p4info.meters:
        for entity in honest.read(p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=m.preamble.id))):
            if entity.meter_entry.HasField("config"):
                copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    for r in honest.p4info.registers if registers else ():
        for entity in honest.read(p4r.Entity(register_entry=p4r.RegisterEntry(register_id=r.preamble.id))):
            copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    return copy


def _clone_profiles(honest: Pipeline, copy: Pipeline) -> None:
    # Members and groups before the entries that name them; one-shot action sets come with their entries.
    # The copy's bmv2 handles may differ (gaps, weighted copies), and with them which member a flow gets.
    for pid, pb in honest.profiles.items():
        if pb.mgr.mode != MANUAL:
            continue
        seen: set[int] = set()
        for entity in honest.read(p4r.Entity(action_profile_member=p4r.ActionProfileMember(action_profile_id=pid))):
            if entity.action_profile_member.member_id not in seen:  # a wildcard read lists weighted copies
                seen.add(entity.action_profile_member.member_id)
                copy.write(p4r.Update(type=p4r.Update.INSERT, entity=entity))
        for entity in honest.read(p4r.Entity(action_profile_group=p4r.ActionProfileGroup(action_profile_id=pid))):
            copy.write(p4r.Update(type=p4r.Update.INSERT, entity=entity))


def _b64(message: Any) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


def _parse(cls: Any, text: str) -> Any:
    message = cls()
    message.ParseFromString(base64.b64decode(text))
    return message


def handle(fw: Firmware, request: dict[str, Any]) -> dict[str, Any]:
    """Carry out one request of the socket protocol (module docstring)."""
    op = request.get("op")
    if op == "p4info":
        return {"p4info": _b64(fw.p4info())}
    if op == "read":
        return {"entities": [_b64(e) for e in fw.read(_parse(p4r.Entity, request["entity"]))]}
    if op == "write":
        fw.write([_parse(p4r.Update, u) for u in request["updates"]], bool(request.get("forge")))
        return {}
    if op == "load":
        fw.load(_parse(p4r.ForwardingPipelineConfig, request["config"]), bool(request.get("forge")))
        return {}
    raise ValueError(f"op: unknown operation {op!r} (p4info, read, write, load)")


async def serve(device: Device, path: Path) -> asyncio.AbstractServer:
    """Listen on Unix socket `path` (owner only) for firmware requests to `device`."""
    fw = LocalFirmware(device)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    answer = handle(fw, json.loads(line))
                except Exception as exc:  # any bad request gets its error back; the device goes on
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(client, path=str(path), limit=1 << 26)
    os.chmod(path, 0o600)
    return server


class FirmwareClient:
    """Firmware requests to a dpu_softswitch process's socket (blocking; one connection per request)."""

    def __init__(self, path: Path, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as f:
                answer: dict[str, Any] = json.loads(f.readline())
        if "error" in answer:
            raise RuntimeError(f"firmware at {self.path}: {answer['error']}")
        return answer

    def p4info(self) -> p4i.P4Info:
        """The P4Info of the pipeline P4Runtime sees."""
        info: p4i.P4Info = _parse(p4i.P4Info, self._call({"op": "p4info"})["p4info"])
        return info

    def read(self, entity: p4r.Entity) -> list[p4r.Entity]:
        """Read the pipeline P4Runtime sees."""
        return [_parse(p4r.Entity, e) for e in self._call({"op": "read", "entity": _b64(entity)})["entities"]]

    def write(self, updates: list[p4r.Update], forge: bool) -> None:
        """Apply updates with no arbitration (to a copy packets take, with `forge`)."""
        self._call({"op": "write", "updates": [_b64(u) for u in updates], "forge": forge})

    def load(self, config: p4r.ForwardingPipelineConfig, forge: bool) -> None:
        """Replace the pipeline (only the one packets take, with `forge`)."""
        self._call({"op": "load", "config": _b64(config), "forge": forge})
