"""Compromised firmware on bmv2: simple_switch_grpc's Thrift runtime API, beside P4Runtime.

bmv2 has a management path of its own next to P4Runtime: the Thrift runtime API (`--thrift-port`),
which changes tables, meters and the program with no arbitration and no trace in the P4Runtime
server's own bookkeeping. A compromised DPU's firmware is modelled on bmv2 by writing through it:

- a meter cell: `bm_meter_set_rates` (bytes per microsecond and a burst, as runtime_CLI's
  `meter_set_rates`; P4Runtime's bytes/s divided by 10^6, as PI converts them);
- a table entry: `bm_mt_add_entry`, or `bm_mt_get_entry_from_key` then `bm_mt_delete_entry`;
- a program: `bm_load_new_config` then `bm_swap_configs`.

Reads go through P4Runtime: a read needs no arbitration, and it returns entities in P4Runtime's
own encoding (ids, canonical bytes) that compromise.py builds its updates from, where Thrift would
need PI's name and key mapping reimplemented. The Thrift client is the one bmv2 itself generates
from its standard.thrift and installs with `make install` (package `bm_runtime`, which its own
runtime_CLI uses), found at run time where bmv2's bm_CLI says it put it, and run with Apache Thrift's
Python library: the interface always matches the switch it talks to, and none of bmv2 is shipped here.

What differs from the embedded target (dpu_softswitch.firmware):

- No forging (NO_FORGE): the lab refuses `forge` on bmv2 before the run.
- Thrift cannot return a meter cell to unconfigured (bmv2's `Meter::reset_rates` is reachable only
  through P4Runtime), so a MeterEntry without config sets the cell to dataplane.OPEN_METER's rates
  instead: every packet is green either way, but P4Runtime reads the cell back as configured at
  those rates where the embedded target shows no config.
- The P4Runtime server (PI) keeps its own record of the entries it wrote. An entry the firmware
  added makes every P4Runtime read of its table fail ("Table state out-of-sync with target") and
  cannot be deleted through P4Runtime; an entry the firmware deleted can be neither inserted
  (ALREADY_EXISTS) nor modified through P4Runtime again. Only a new pipeline clears both.
- A swapped-in program leaves P4Runtime's P4Info and cookie as they were (PI is not told), so a
  controller still sees its own pipeline while reads of its tables, meters and counters fail.
"""

from __future__ import annotations

import functools
import importlib
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from finsy.proto import p4i, p4r, p4r_grpc
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.protocol.TMultiplexedProtocol import TMultiplexedProtocol
from thrift.Thrift import TException
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TBufferedTransport

from dpu_limiter import dataplane as dp

NO_FORGE = (
    "bmv2's P4Runtime server reads the very tables, meters and counters that packets use, so its "
    "firmware cannot show P4Runtime one pipeline and forward with another (forging is the embedded target's)"
)
_CONTEXT = 0  # simple_switch has one context


def bmv2_python_dir() -> Path:
    """Where bmv2's `make install` put its Python packages, as its bm_CLI wrapper script records it.

    bm_CLI (installed beside simple_switch_grpc when bmv2 is built with Thrift) appends that
    directory to sys.path before importing runtime_CLI; bm_runtime, the generated Thrift client,
    lies there too.
    """
    path = shutil.which("bm_CLI")
    if path is None:
        raise RuntimeError(
            "bmv2's Thrift client was not found: bm_CLI is not on PATH (bmv2 installed without Thrift, "
            "or not with `make install`)"
        )
    found = re.search(r"""sys\.path\.append\(["']([^"']+)["']\)""", Path(path).read_text())
    if found is None or not (Path(found[1]) / "bm_runtime" / "standard" / "Standard.py").is_file():
        raise RuntimeError(f"bmv2's Thrift client (bm_runtime/standard) is not where {path} says bmv2's Python lies")
    return Path(found[1])


@functools.cache
def _standard() -> tuple[ModuleType, ModuleType]:
    """bmv2's generated Standard service and its types (imported once per process)."""
    where = str(bmv2_python_dir())
    if where not in sys.path:
        sys.path.append(where)  # appended, as bm_CLI does: nothing of ours is shadowed
    return importlib.import_module("bm_runtime.standard.Standard"), importlib.import_module(
        "bm_runtime.standard.ttypes"
    )


def _width(value: bytes, bitwidth: int, what: str) -> bytes:
    """P4Runtime's canonical bytes padded to the field's full width, as bmv2 takes them."""
    n = int.from_bytes(value, "big")
    if n >> bitwidth:
        raise ValueError(f"{what}: value 0x{value.hex()} does not fit in {bitwidth} bits")
    return n.to_bytes((bitwidth + 7) // 8, "big")


class Bmv2Firmware:
    """Firmware acting on a simple_switch_grpc: writes through Thrift, reads through P4Runtime."""

    def __init__(self, thrift_port: int, p4runtime: str, device_id: int, timeout_s: float = 10.0) -> None:
        self.thrift_port = thrift_port
        self.p4runtime = p4runtime
        self.device_id = device_id
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ reads (P4Runtime)

    @contextmanager
    def _p4rt(self) -> Iterator[p4r_grpc.P4RuntimeStub]:
        with grpc.insecure_channel(self.p4runtime) as channel:
            yield p4r_grpc.P4RuntimeStub(channel)  # type: ignore[no-untyped-call]

    def p4info(self) -> p4i.P4Info:
        """The P4Info of the pipeline P4Runtime sees."""
        with self._p4rt() as stub:
            request = p4r.GetForwardingPipelineConfigRequest(
                device_id=self.device_id, response_type=p4r.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE
            )
            reply = stub.GetForwardingPipelineConfig(request, timeout=self.timeout_s)
        if not reply.config.HasField("p4info"):
            raise ValueError(f"bmv2 at {self.p4runtime} has no pipeline to tamper with")
        info: p4i.P4Info = reply.config.p4info
        return info

    def read(self, entity: p4r.Entity) -> list[p4r.Entity]:
        """Read the pipeline P4Runtime sees, as a P4Runtime read would (no arbitration needed)."""
        with self._p4rt() as stub:
            request = p4r.ReadRequest(device_id=self.device_id, entities=[entity])
            return [e for reply in stub.Read(request, timeout=self.timeout_s) for e in reply.entities]

    # ------------------------------------------------------------------ writes (Thrift)

    @contextmanager
    def _thrift(self) -> Iterator[Any]:
        service, std = _standard()
        sock = TSocket("127.0.0.1", self.thrift_port)
        sock.setTimeout(self.timeout_s * 1000)
        transport = TBufferedTransport(sock)
        try:
            transport.open()
        except TException as exc:
            raise RuntimeError(f"no Thrift runtime API on 127.0.0.1:{self.thrift_port}: {exc}") from None
        try:
            yield service.Client(TMultiplexedProtocol(TBinaryProtocol(transport), "standard"))
        except TException as exc:  # bmv2's own error, by name
            codes = {
                std.InvalidTableOperation: std.TableOperationErrorCode,
                std.InvalidMeterOperation: std.MeterOperationErrorCode,
                std.InvalidSwapOperation: std.SwapOperationErrorCode,
            }
            enum = codes.get(type(exc))
            what = enum._VALUES_TO_NAMES.get(exc.code, exc.code) if enum else exc  # type: ignore[attr-defined]
            raise RuntimeError(f"bmv2 Thrift on 127.0.0.1:{self.thrift_port}: {type(exc).__name__} {what}") from None
        finally:
            transport.close()

    def write(self, updates: list[p4r.Update], forge: bool) -> None:
        """Apply P4Runtime-shaped updates through Thrift, with no arbitration (never forged: NO_FORGE)."""
        if forge:
            raise ValueError(f"forge: {NO_FORGE}")
        info = self.p4info()
        with self._thrift() as client:
            for update in updates:
                kind = update.entity.WhichOneof("entity")
                if kind == "meter_entry" and update.type == p4r.Update.MODIFY:
                    self._meter(client, info, update.entity.meter_entry)
                elif kind == "table_entry" and update.type in (p4r.Update.INSERT, p4r.Update.DELETE):
                    self._table(client, info, update.entity.table_entry, update.type == p4r.Update.INSERT)
                else:
                    raise ValueError(
                        f"updates: {p4r.Update.Type.Name(update.type)} of a {kind} is not something the bmv2 "
                        "firmware does (meter MODIFY, table entry INSERT or DELETE)"
                    )

    def load(self, config: p4r.ForwardingPipelineConfig, forge: bool) -> None:
        """Load and swap in another program (never forged: NO_FORGE); P4Runtime's P4Info stays as it was."""
        if forge:
            raise ValueError(f"forge: {NO_FORGE}")
        with self._thrift() as client:
            client.bm_load_new_config(config.p4_device_config.decode())
            client.bm_swap_configs()

    def _meter(self, client: Any, info: p4i.P4Info, entry: p4r.MeterEntry) -> None:
        std = _standard()[1]
        meter = next((m for m in info.meters if m.preamble.id == entry.meter_id), None)
        if meter is None:
            raise ValueError(f"meter_entry.meter_id: {entry.meter_id} is no indirect meter of the pipeline")
        # No config means unconfigured, which Thrift cannot do: open wide instead (module docstring).
        c = entry.config if entry.HasField("config") else dp.OPEN_METER
        rates = [
            std.BmMeterRateConfig(units_per_micros=c.cir / 1e6, burst_size=c.cburst),
            std.BmMeterRateConfig(units_per_micros=c.pir / 1e6, burst_size=c.pburst),
        ]
        client.bm_meter_set_rates(_CONTEXT, meter.preamble.name, entry.index.index, rates)

    def _table(self, client: Any, info: p4i.P4Info, entry: p4r.TableEntry, insert: bool) -> None:
        std = _standard()[1]
        table = next((t for t in info.tables if t.preamble.id == entry.table_id), None)
        if table is None:
            raise ValueError(f"table_entry.table_id: {entry.table_id} is no table of the pipeline")
        name = table.preamble.name
        if entry.is_default_action or entry.priority:
            raise ValueError(f"table_entry ({name}): the firmware sets no default action and no priority")
        given = {m.field_id: m for m in entry.match}
        key = []
        for f in table.match_fields:
            m = given.get(f.id)
            what = f"table_entry ({name}).match.{f.name}"
            if f.match_type == p4i.MatchField.EXACT and m is not None:
                exact = std.BmMatchParamExact(key=_width(m.exact.value, f.bitwidth, what))
                key.append(std.BmMatchParam(type=std.BmMatchParamType.EXACT, exact=exact))
            elif f.match_type == p4i.MatchField.LPM:
                value, prefix = (m.lpm.value, m.lpm.prefix_len) if m is not None else (b"", 0)  # absent: /0
                lpm = std.BmMatchParamLPM(key=_width(value, f.bitwidth, what), prefix_length=prefix)
                key.append(std.BmMatchParam(type=std.BmMatchParamType.LPM, lpm=lpm))
            else:
                kind = p4i.MatchField.MatchType.Name(f.match_type)
                raise ValueError(f"{what}: {kind} {'without a value ' if m is None else ''}is not handled (EXACT, LPM)")
        options = std.BmAddEntryOptions()
        if not insert:
            handle = client.bm_mt_get_entry_from_key(_CONTEXT, name, key, options).entry_handle
            client.bm_mt_delete_entry(_CONTEXT, name, handle)
            return
        if not entry.action.HasField("action"):
            raise ValueError(f"table_entry ({name}).action: only a direct action is handled")
        act = entry.action.action
        action = next((a for a in info.actions if a.preamble.id == act.action_id), None)
        if action is None:
            raise ValueError(f"table_entry ({name}).action.action_id: {act.action_id} is no action of the pipeline")
        values = {p.param_id: p.value for p in act.params}
        data = [
            _width(values.get(p.id, b""), p.bitwidth, f"table_entry ({name}).action.{p.name}") for p in action.params
        ]
        client.bm_mt_add_entry(_CONTEXT, name, key, action.preamble.name, data, options)
