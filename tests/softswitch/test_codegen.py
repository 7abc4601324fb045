"""The generated code against the closure interpreter it stands in for, and memoised parses against fresh ones.

Each corpus program (tests/softswitch/corpus, set and programmed as in test_corpus.py) runs its frames three
ways on the in-process target: with the generated pipelines and parser; with generation disabled,
so the interpreter runs them; and with every frame a fresh copy, so the parse memo never applies.
The frames go through twice, so the memo does apply the second time in the first run. Outputs, the
PacketIns and DigestLists the device sends and the state the case reads back must agree exactly.
"""

from __future__ import annotations

import grpc
import pytest

import dpu_softswitch.program
from corpus_cases import CASES, Collector, Frames, embedded_step, pipeline, schema, stream_view
from dpu_softswitch.server import Device
from helpers.p4rt import Client, connect

InProcess = tuple[Device, grpc.aio.Channel]
Outcome = tuple[list[Frames], list[tuple[object, ...]], dict[str, object]]


async def outcome(device: Device, c: Client, name: str, fresh: bool) -> Outcome:
    """Outputs of the case's frames (twice over) and steps, the PacketIns and DigestLists the device sent,
    and its state afterwards, on a freshly set pipeline."""
    case, sch = CASES[name], schema(name)
    device.cpu_port = case.cpu_port
    heard = Collector()
    device.listeners.append(heard)
    await c.set_pipeline(pipeline(name))
    await case.setup(c, sch)
    await case.extra_setup(c, sch)
    frames = case.frames * 2
    outputs = [device.process(port, bytes(bytearray(frame)) if fresh else frame) for port, frame in frames]
    outputs += [await embedded_step(step, device, c) for step in case.steps(sch)]
    device.listeners.remove(heard)
    return outputs, stream_view(heard.messages), await case.state(c, sch)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_generated_code_matches_interpreter_and_memo_matches_fresh_parses(
    in_process_target: InProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    generated = await outcome(device, c, name, fresh=False)
    assert generated == await outcome(device, c, name, fresh=True)
    monkeypatch.setattr(dpu_softswitch.program, "_MAX_LINES", -1)  # no generated pipeline or parser fits
    interpreted = await outcome(device, c, name, fresh=True)
    assert device.pipeline is not None and device.pipeline.program.ingress.__name__ == "run"
    assert generated == interpreted
