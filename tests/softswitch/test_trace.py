"""The packet trace of --log-console (dpu_softswitch.trace): what it says, that it changes no packet's fate, that
it is absent when off, and the options that turn it on."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import grpc
import pytest

from corpus_cases import (
    CASES,
    CORPUS,
    CPU_PORT,
    Collector,
    embedded_step,
    packet_io_steps,
    pipeline,
    schema,
    stream_request,
)
from dpu_softswitch.main import build_parser, tracer_for
from dpu_softswitch.program import Program
from dpu_softswitch.trace import Tracer
from dpu_softswitch.v1model import SimpleSwitch
from helpers.p4rt import connect
from helpers.planes import serve_in_process
from helpers.processes import free_port, start_embedded, stop

ETH = bytes.fromhex("ffffffffffff000000000001")
PROBE = ETH + bytes.fromhex("9300") + bytes([0x15]) + bytes.fromhex("1234") + bytes(44)  # a = 0x15, b = 0x1234
IPV4 = ETH + bytes.fromhex("0800") + bytes(46)  # no probe header: lpm_const drops it
SHORT = ETH + bytes.fromhex("9300") + b"\x15"  # the probe header cut short: PacketTooShort


def packets(trace: str) -> dict[str, list[str]]:
    """The trace's messages by packet id (the tag's number before the dot)."""
    out: dict[str, list[str]] = {}
    for line in trace.splitlines():
        if line.startswith("["):
            tag, msg = line.split("] [cxt 0] ", 1)
            out.setdefault(tag.rsplit("[", 1)[1].split(".")[0], []).append(msg)
    return out


def test_trace_names_states_tables_actions_and_decisions() -> None:
    buf = io.StringIO()
    prog = Program.from_bytes((CORPUS / "lpm_const.json").read_bytes(), trace=Tracer(buf))
    plain = Program.from_bytes((CORPUS / "lpm_const.json").read_bytes())
    for frame in (PROBE, IPV4, SHORT):
        assert prog.process(0, frame) == plain.process(0, frame)
    by_packet = packets(buf.getvalue())
    assert sorted(by_packet) == ["0", "1", "2"]
    first = by_packet["0"]
    # In order, with bmv2's wording: parser, condition, tables hit and missed, actions, decision.
    expected = [
        "Processing packet received on port 0",
        "Parser 'parser' entering state 'start'",
        "Extracting header 'ethernet'",
        "Parser 'parser' entering state 'probe'",
        "Extracting header 'probe'",
        "Parser 'parser': end",
        "Pipeline 'ingress': start",
        'lpm_const.p4(86) Condition "hdr.probe.isValid()" (node_2) is true',
        "Applying table 'I.prefixes'",
        "Table 'I.prefixes': hit, entry [11/4]",
        "Action entry is I.mark1(v=0x1)",
        "Table 'I.by_b': miss",
        "Action entry is NoAction()",
        "standard_metadata.egress_spec: 0 -> 1",
        "Egress port is 1",
        "Deparsing header 'probe'",
        "Transmitting packet of size 61 out of port 1",
    ]
    at = 0
    for want in expected:
        at = next((k for k in range(at, len(first)) if first[k] == want), -1)
        assert at >= 0, f"{want!r} missing or out of order in:\n" + "\n".join(first)
    assert "Looking up key:\n* hdr.probe.a         : 15\n" in buf.getvalue()  # key lines follow, as bmv2
    dropped = by_packet["1"]
    assert 'lpm_const.p4(86) Condition "hdr.probe.isValid()" (node_2) is false' in dropped
    assert "standard_metadata.egress_spec: 0 -> 511 (mark_to_drop: dropped)" in dropped
    assert dropped[-2:] == ["Dropping packet at the end of ingress", "No packet out: dropped"]
    assert "Parser 'parser': error PacketTooShort at byte 14" in by_packet["2"]


def test_debug_level_leaves_out_trace_lines() -> None:
    buf = io.StringIO()
    prog = Program.from_bytes((CORPUS / "lpm_const.json").read_bytes(), trace=Tracer(buf, detail=False))
    prog.process(0, PROBE)
    text = buf.getvalue()
    assert "] [D] [0.0] [cxt 0] Table 'I.prefixes': hit" in text
    assert "[T]" not in text and "Condition" not in text


def test_tracing_off_writes_nothing_and_keeps_the_generated_path(capsys: pytest.CaptureFixture[str]) -> None:
    prog = Program.from_bytes((CORPUS / "lpm_const.json").read_bytes())
    assert prog.trace is None
    assert prog.process.__func__ is SimpleSwitch.process  # type: ignore[attr-defined]
    assert prog.ingress.__name__ == "pipeline_ingress"  # generated, with no tracing in it
    for frame in (PROBE, IPV4, SHORT):
        prog.process(0, frame)
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


# What some cases' traces must say: each kind of decision, meter colours, extern cells, digests.
SAYS = {
    "replication": [
        "Multicast requested for packet, group 5",
        "Processing replica packet for port 3",
        "Cloning packet at ingress to session 4",
        "Cloning packet at egress to session 7",
        "Resubmitting packet",
        "Processing resubmitted packet",
        "Recirculating packet",
        "Processing recirculated packet",
    ],
    "direct_res": ["Direct meter of 'I.classify' (run before the action): GREEN", "Direct counter of 'I.classify'"],
    "indirect_res": ["Meter 'I.byte_meter'[0]: GREEN", "Counter 'I.by_packets'[0] counted"],
    "registers_exit": [
        "Register 'I.seen'[0] read: 0x0",
        "Register 'I.seen'[0] written: 0x1",
        "Pipeline 'egress': exit",
    ],
    "action_selector": ["Table 'I.l2' has no default action: none runs"],
    "digest": ["Digest generated (learn list 1)"],
    "packet_io": ["(CPU port: a PacketIn)"],
    "header_stack": ["Extracting header 'mpls[0]'"],
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_traced_program_forwards_as_untraced(name: str) -> None:
    """Every corpus case's frames (and PacketOuts) give the same outputs traced as untraced."""
    case = CASES[name]
    results = []
    traces = []
    for traced in (False, True):
        buf = io.StringIO()
        device, server, address = await serve_in_process(cpu_port=case.cpu_port)
        device.trace = Tracer(buf, cpu_port=case.cpu_port) if traced else None
        device.listeners.append(Collector())
        channel = grpc.aio.insecure_channel(address)
        try:
            c = await connect(channel, 5)
            await c.responses.get()
            await c.set_pipeline(pipeline(name))
            sch = schema(name)
            await case.setup(c, sch)
            await case.extra_setup(c, sch)
            out = [device.process(port, frame) for port, frame in case.frames]
            for step in case.steps(sch):
                out.append(await embedded_step(step, device, c))
            results.append(out)
        finally:
            await channel.close()
            await server.stop(grace=0)
        traces.append(buf.getvalue())
    assert results[0] == results[1]
    assert traces[0] == ""
    assert traces[1].count("Processing packet received on port") >= len(case.frames)
    for says in SAYS.get(name, []):
        assert says in traces[1], says


@pytest.mark.parametrize(
    ("argv", "traced", "detail"),
    [
        ([], False, False),
        (["--log-console"], True, True),  # bmv2's default level is trace
        (["--log-console", "-L", "debug"], True, False),
        (["--log-console", "--log-level", "trace"], True, True),
        (["--log-console", "--log-level", "info"], False, False),
        (["--log-console", "--log-level", "off"], False, False),
        (["--log-level", "trace"], False, False),  # no console: no trace
        (["--log-level", "warning"], False, False),  # the earlier spelling still parses
    ],
)
def test_log_options(argv: list[str], traced: bool, detail: bool) -> None:
    args = build_parser().parse_args(["--no-p4", "--cpu-port", "510", *argv])
    tracer = tracer_for(args)
    assert (tracer is not None) == traced
    if tracer is not None:
        assert tracer.detail == detail and tracer.cpu_port == 510


def test_log_level_refuses_unknown_levels(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-level", "verbose"])
    assert "invalid choice" in capsys.readouterr().err


async def test_log_console_traces_packets_of_the_target_process(tmp_path: Path) -> None:
    """`dpu_softswitch.main --log-console -L debug`: PacketOuts entering on the CPU port are traced on stdout."""
    port, log = free_port(), tmp_path / "target.log"
    proc = start_embedded(port, log, ["--log-console", "-L", "debug"], cpu_port=CPU_PORT)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            c = await connect(channel, 5)
            await c.responses.get()
            await c.set_pipeline(pipeline("packet_io"))
            steps = packet_io_steps(schema("packet_io"))
            for step in (steps[0], steps[2]):  # to port 2, then to the CPU port
                c.requests.put_nowait(stream_request(step))  # type: ignore[arg-type]
            await asyncio.sleep(0.5)
            c.requests.put_nowait(None)
    finally:
        stop(proc)
    text = log.read_text()
    assert f"[D] [0.0] [cxt 0] Processing packet received on port {CPU_PORT} (the CPU port: a PacketOut)" in text
    assert "[D] [0.*] [cxt 0] Transmitting packet of size" in text and "out of port 2\n" in text
    assert f"out of port {CPU_PORT} (CPU port: a PacketIn)" in text
    assert "[T]" not in text  # debug level: no trace-level lines


def test_log_msg_prints_its_message_when_traced() -> None:
    """log_msg is a no-op untraced; traced, bmv2's info line with the `{}`s filled in decimal."""
    doc = json.loads((CORPUS / "lpm_const.json").read_bytes())
    fields = [{"type": "field", "value": ["probe", "a"]}, {"type": "field", "value": ["probe", "b"]}]
    log_msg = {
        "op": "log_msg",
        "parameters": [{"type": "string", "value": "a={} b={}!"}, {"type": "parameters_vector", "value": fields}],
    }
    next(a for a in doc["actions"] if a["name"] == "lpm_const91")["primitives"].insert(0, log_msg)
    buf = io.StringIO()
    traced, plain = Program(doc, trace=Tracer(buf)), Program(doc)
    assert traced.process(0, PROBE) == plain.process(0, PROBE)
    assert "] [I] [0.0] [cxt 0] a=21 b=4660!\n" in buf.getvalue()
