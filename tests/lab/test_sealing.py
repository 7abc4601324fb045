"""The model of the DPU's inline crypto engine (dpu_lab.sealing): the MACsec frame format, what opens and
what does not, and the engine as a process on veth pairs in a namespace of its own."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import dpu_lab
from dpu_lab.netns import entered
from dpu_lab.sealing import (
    ETHERTYPE_MACSEC,
    OVERHEAD,
    Engine,
    Opener,
    PacketNumberExhausted,
    Port,
    Sealer,
    sci_of,
)
from dpu_softswitch.ports import AUX_SPACE, ETH_P_ALL, PACKET_AUXDATA, PACKET_IGNORE_OUTGOING, SOL_PACKET, with_vlan_tag

KEY_A = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
KEY_B = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")
MAC_1 = bytes.fromhex("020001000001")  # a node of pod a, whose DPU runs the engine
MAC_2 = bytes.fromhex("020001000002")  # its pod peer
MAC_9 = bytes.fromhex("020002000001")  # a node of pod b
TEST_ETHERTYPE = 0x88B5  # IEEE local experimental: nothing else in the namespace sends it


def frame(dst: bytes, src: bytes, payload: bytes, ethertype: int = TEST_ETHERTYPE, vlan: int | None = None) -> bytes:
    """An Ethernet frame (no FCS), 802.1Q-tagged with ``vlan`` if given."""
    tag = b"" if vlan is None else struct.pack("!HH", 0x8100, vlan)
    return dst + src + tag + struct.pack("!H", ethertype) + payload


def flipped(data: bytes, bit: int) -> bytes:
    """``data`` with one bit inverted."""
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


# The format and the checks.


def test_a_frame_round_trips_and_counts_per_peer() -> None:
    sealer, opener = Sealer(KEY_A, sci_of(MAC_1)), Opener(KEY_A)
    clear = [frame(MAC_2, MAC_1, bytes(range(200))), frame(MAC_9, MAC_1, b"x" * 1500), frame(MAC_2, MAC_1, b"y")]
    sealed = [sealer.seal(f) for f in clear]
    assert [opener.open(s) for s in sealed] == clear
    assert [len(s) - len(f) for s, f in zip(sealed, clear, strict=True)] == [OVERHEAD] * 3
    assert sealer.sent_bytes == {"02:00:01:00:00:02": len(clear[0]) + len(clear[2]), "02:00:02:00:00:01": 1514}
    assert opener.received_bytes == {"02:00:01:00:00:01": sum(map(len, clear))}
    assert (sealer.sealed_frames, sealer.sealed_bytes) == (3, sum(map(len, clear)))
    counts = opener.counts
    assert (counts.opened, counts.opened_bytes) == (3, sum(map(len, sealed)))
    assert counts.not_sealed == counts.rejected == counts.replayed == 0


def test_the_layout_is_802_1ae_gcm_aes_128_with_an_explicit_sci() -> None:
    sci = sci_of(MAC_1)
    assert sci == MAC_1 + b"\x00\x01" and sci_of(MAC_1, port=7) == MAC_1 + b"\x00\x07"
    sealer = Sealer(KEY_A, sci)
    clear = frame(MAC_2, MAC_1, bytes(100), ethertype=0x0800)
    for pn in (1, 2):
        sealed = sealer.seal(clear)
        assert sealed[:12] == clear[:12]  # the MACs stay
        assert int.from_bytes(sealed[12:14], "big") == ETHERTYPE_MACSEC == 0x88E5
        assert sealed[14] == 0x2C  # V 0, ES 0, SC 1, SCB 0, E 1, C 1, AN 0
        assert sealed[15] == 0  # 102 bytes of secure data: no short length
        assert int.from_bytes(sealed[16:20], "big") == pn
        assert sealed[20:28] == sci
        nonce, aad = sci + pn.to_bytes(4, "big"), sealed[:28]
        assert AESGCM(KEY_A).decrypt(nonce, sealed[28:], aad) == clear[12:]  # EtherType + payload; ICV last
        assert sealed[28:-16] != clear[12:]  # encrypted, not just authenticated
        assert len(sealed) == 28 + len(clear) - 12 + 16


@pytest.mark.parametrize("payload", [0, 1, 45, 46, 47])
def test_small_frames_carry_their_length_and_round_trip_with_padding(payload: int) -> None:
    sealer, opener = Sealer(KEY_A, sci_of(MAC_1)), Opener(KEY_A)
    clear = frame(MAC_2, MAC_1, bytes(payload))
    sealed = sealer.seal(clear)
    secure = len(clear) - 12
    assert sealed[15] == (secure if secure < 48 else 0)
    assert opener.open(sealed) == clear
    if sealed[15]:
        # A NIC pads a short frame to Ethernet's 60 bytes; the short length says where the frame ends.
        padded = sealer.seal(clear)
        assert opener.open(padded + bytes(max(0, 60 - len(padded)) + 4)) == clear
    assert opener.counts.opened == (2 if sealed[15] else 1)


def test_a_frame_sealed_under_another_pods_key_does_not_open() -> None:
    sealed = Sealer(KEY_B, sci_of(MAC_9)).seal(frame(MAC_1, MAC_9, b"from pod b"))
    opener = Opener(KEY_A)
    assert opener.open(sealed) is None
    assert (opener.counts.rejected, opener.counts.rejected_bytes, opener.counts.opened) == (1, len(sealed), 0)
    assert opener.received_bytes == {}


@pytest.mark.parametrize("payload", [10, 300])  # with and without a short length
def test_a_flipped_bit_anywhere_is_rejected(payload: int) -> None:
    sealed = Sealer(KEY_A, sci_of(MAC_2)).seal(frame(MAC_1, MAC_2, bytes(i % 256 for i in range(payload))))
    opener = Opener(KEY_A)
    bits = len(sealed) * 8
    for bit in range(bits):  # MACs, EtherType, TCI, SL, PN, SCI, ciphertext, ICV
        assert opener.open(flipped(sealed, bit)) is None, f"bit {bit} flipped, and the frame opened"
    counts = opener.counts
    assert counts.not_sealed == 16  # the bits of 0x88E5: no longer MACsec, passed on (and metered) as is
    assert counts.rejected == bits - 16
    assert counts.opened == counts.replayed == 0
    # No forgery (a flipped PN above the true one, say) moved the replay window.
    assert opener.open(sealed) is not None


def test_a_replayed_frame_is_rejected_per_sender() -> None:
    one, two = Sealer(KEY_A, sci_of(MAC_1)), Sealer(KEY_A, sci_of(MAC_2))
    a1, a2, b1 = (
        one.seal(frame(MAC_2, MAC_1, b"1")),
        one.seal(frame(MAC_2, MAC_1, b"2")),
        two.seal(frame(MAC_1, MAC_2, b"3")),
    )
    opener = Opener(KEY_A)
    assert opener.open(a1) is not None
    assert opener.open(a1) is None  # the same frame again
    assert opener.open(a2) is not None
    assert opener.open(a1) is None  # an older one, after a newer
    assert opener.open(b1) is not None  # another sender's PN 1: its own window
    assert opener.open(b1) is None
    counts = opener.counts
    assert (counts.opened, counts.replayed, counts.rejected) == (3, 3, 0)
    assert counts.replayed_bytes == 2 * len(a1) + len(b1)
    assert opener.received_bytes == {"02:00:01:00:00:01": 2 * 15, "02:00:01:00:00:02": 15}


def test_truncated_frames_are_rejected() -> None:
    sealer = Sealer(KEY_A, sci_of(MAC_2))
    for payload in (5, 500):
        sealed = sealer.seal(frame(MAC_1, MAC_2, bytes(payload)))
        opener = Opener(KEY_A)
        for n in range(len(sealed)):
            assert opener.open(sealed[:n]) is None, f"{n} of {len(sealed)} bytes opened"
        assert opener.counts.rejected == len(sealed)  # each prefix: 0x88E5, or too short to say it is not
        assert opener.open(sealed) is not None


def test_malformed_sectags_are_rejected_even_when_authentic() -> None:
    # A sender that lies in its SecTAG: the right key, a well-formed GCM tag, but fields 802.1AE forbids.
    aead, sci = AESGCM(KEY_A), sci_of(MAC_2)
    clear = frame(MAC_1, MAC_2, bytes(100))

    def sealed_with(tci: int, sl: int, pn: int) -> bytes:
        header = clear[:12] + struct.pack("!HBBI", ETHERTYPE_MACSEC, tci, sl, pn) + sci
        return header + aead.encrypt(sci + pn.to_bytes(4, "big"), clear[12:], header)

    opener = Opener(KEY_A)
    assert opener.open(sealed_with(0x2C, 0, 0)) is None  # PN 0 is never sent
    assert opener.open(sealed_with(0x2D, 0, 1)) is None  # another association number
    assert opener.open(sealed_with(0x28, 0, 2)) is None  # not encrypted
    assert opener.open(sealed_with(0x2C, 40, 3)) is None  # a short length on a long frame
    assert opener.counts.rejected == 4
    assert opener.open(sealed_with(0x2C, 0, 5)) == clear


def test_an_opener_rejects_its_own_channel_reflected_back() -> None:
    sealer = Sealer(KEY_A, sci_of(MAC_1))
    sealed = sealer.seal(frame(MAC_2, MAC_1, b"mine"))
    assert Opener(KEY_A, own_sci=sci_of(MAC_1)).open(sealed) is None
    assert Opener(KEY_A, own_sci=sci_of(MAC_2)).open(sealed) is not None


def test_packet_numbers_run_out_rather_than_wrap() -> None:
    sealer = Sealer(KEY_A, sci_of(MAC_1))
    sealer.next_pn = 2**32 - 1
    last = sealer.seal(frame(MAC_2, MAC_1, b"last"))
    assert last[16:20] == b"\xff\xff\xff\xff"
    with pytest.raises(PacketNumberExhausted):
        sealer.seal(frame(MAC_2, MAC_1, b"one too many"))
    assert sealer.sealed_frames == 1


def test_bad_lengths_raise_naming_the_argument() -> None:
    with pytest.raises(ValueError, match=r"key must be 16 bytes, got 32"):
        Sealer(bytes(32), sci_of(MAC_1))
    with pytest.raises(ValueError, match=r"key must be 16 bytes, got 15"):
        Opener(bytes(15))
    with pytest.raises(ValueError, match=r"sci must be 8 bytes, got 6"):
        Sealer(KEY_A, MAC_1)
    with pytest.raises(ValueError, match=r"mac must be 6 bytes, got 8"):
        sci_of(sci_of(MAC_1))
    with pytest.raises(ValueError, match=r"frame must be at least 14 bytes, got 13"):
        Sealer(KEY_A, sci_of(MAC_1)).seal(bytes(13))


def test_the_engine_routes_each_port_and_counts_what_could_not_go() -> None:
    engine = Engine(KEY_A, MAC_1)
    sent: list[tuple[Port, bytes]] = []

    def send(port: Port, data: bytes) -> None:
        if len(data) > 1600 + 14:
            raise OSError(errno.EMSGSIZE, "Message too long")
        sent.append((port, data))

    peer = Sealer(KEY_A, sci_of(MAC_2))
    inter_pod = frame(MAC_9, MAC_1, b"metered")
    exempt = frame(MAC_2, MAC_1, b"exempt")
    incoming = peer.seal(frame(MAC_1, MAC_2, b"from a peer"))
    engine.pass_on("clear", inter_pod, send)
    engine.pass_on("seal", exempt, send)
    engine.pass_on("wire", incoming, send)
    engine.pass_on("wire", incoming, send)  # replayed
    engine.pass_on("seal", frame(MAC_2, MAC_1, bytes(1600)), send)  # too large once sealed
    assert [port for port, _ in sent] == ["wire", "wire", "seal", "clear"]
    assert sent[0][1] == inter_pod and sent[3][1] == incoming
    assert Opener(KEY_A).open(sent[1][1]) == exempt
    assert sent[2][1] == frame(MAC_1, MAC_2, b"from a peer")
    report = engine.report()
    assert report["forwarded"] == {"clear->wire": 1, "seal->wire": 1, "wire->seal": 1, "wire->clear": 1}
    assert report["dropped"] == 1 and report["dropped_by_reason"] == {"too_large": 1}
    # What was not sent is not counted as sent to the peer.
    assert report["sealed_frames"] == 1 and report["sent_bytes"] == {"02:00:01:00:00:02": len(exempt)}
    assert report["received_bytes"] == {"02:00:01:00:00:02": len(sent[2][1])}
    assert report["opener"]["opened"] == report["opener"]["replayed"] == 1


# The engine as a process, on veth pairs in a namespace of its own.


def _why_no_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (iproute2)"
    return None


WIRE_MTU = 1600
LAB_PATH = str(Path(dpu_lab.__file__).resolve().parent.parent)
_TEXT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert res.returncode == 0, f"ip {' '.join(args)}: {res.stderr.strip()}"


@pytest.fixture
def engine_ns() -> Iterator[str]:
    """A namespace holding three veth pairs: the engine takes c1, s1, w1; the test sends on c0, s0, w0."""
    name = f"sealtest-{secrets.token_hex(4)}"
    _ip("netns", "add", name)
    try:
        for key in ("all", "default"):  # no IPv6 chatter on the links: every frame on them is the test's
            _ip("netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1")
        _ip("-n", name, "link", "set", "lo", "up")
        for p in "csw":
            _ip("-n", name, "link", "add", f"{p}0", "type", "veth", "peer", "name", f"{p}1")
        # The clear pair carries the wire's frames that do not open; the seal pair a frame too large to seal.
        for link in ("c0", "c1", "s0", "s1", "w0", "w1"):
            _ip("-n", name, "link", "set", link, "mtu", str(WIRE_MTU))
        for p in "csw":
            for end in "01":
                _ip("-n", name, "link", "set", f"{p}{end}", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _listen(iface: str) -> socket.socket:
    """An AF_PACKET socket on ``iface`` (in the current namespace) for the frames it receives."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    sock.bind((iface, ETH_P_ALL))
    sock.settimeout(30.0)  # generous: a slow machine, not a lost frame, is what a wait here absorbs
    return sock


def _next_test_frame(sock: socket.socket) -> bytes:
    """The next frame of this test's (test EtherType, VLAN or MACsec) on ``sock``, its VLAN tag put back."""
    while True:
        data, anc, _, _ = sock.recvmsg(65_600, AUX_SPACE)
        data = with_vlan_tag(data, anc)
        if int.from_bytes(data[12:14], "big") in (TEST_ETHERTYPE, 0x8100, ETHERTYPE_MACSEC):
            return data


@pytest.mark.netns
@pytest.mark.skipif(_why_no_netns() is not None, reason=str(_why_no_netns()))
def test_the_engine_seals_opens_and_passes_frames_between_its_interfaces(engine_ns: str, tmp_path: Path) -> None:
    stats = tmp_path / "stats.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [LAB_PATH, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "dpu_lab.sealing", "--clear", "c1", "--seal", "s1", "--wire", "w1"]
    command += ["--mac", "02:00:01:00:00:01", "--stats", str(stats)]
    with entered(engine_ns):
        socks = {iface: _listen(iface) for iface in ("c0", "s0", "w0")}
    proc = subprocess.Popen(
        ["ip", "netns", "exec", engine_ns, *command],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(KEY_A.hex() + "\n")
        proc.stdin.close()
        ready = proc.stdout.readline()
        assert ready.startswith("sealing: ready"), f"engine did not start: {ready!r} {proc.stderr.read()}"
        c0, s0, w0 = socks["c0"], socks["s0"], socks["w0"]

        # clear -> wire, unchanged (an untagged and a tagged frame)
        for clear in (frame(MAC_9, MAC_1, b"inter-pod" * 10), frame(MAC_9, MAC_1, b"tagged" * 10, vlan=7)):
            c0.send(clear)
            assert _next_test_frame(w0) == clear
        # seal -> wire, sealed under the pod's key and the engine's SCI (a full-size and a tagged frame)
        exempt = [frame(MAC_2, MAC_1, bytes(1500)), frame(MAC_2, MAC_1, b"tagged" * 10, vlan=7)]
        own_sealed = []
        for clear in exempt:
            s0.send(clear)
            sealed = _next_test_frame(w0)
            assert int.from_bytes(sealed[12:14], "big") == ETHERTYPE_MACSEC
            assert sealed[20:28] == sci_of(MAC_1) and len(sealed) == len(clear) + OVERHEAD
            assert Opener(KEY_A).open(sealed) == clear
            own_sealed.append(sealed)
        # wire -> seal, opened: a peer's sealed frame
        peer = Sealer(KEY_A, sci_of(MAC_2))
        from_peer = frame(MAC_1, MAC_2, b"intra-pod" * 10)
        sealed_by_peer = peer.seal(from_peer)
        w0.send(sealed_by_peer)
        assert _next_test_frame(s0) == from_peer
        # wire -> clear, unchanged: replayed, forged (pod b's key), not sealed, the engine's own reflected (not
        # addressed to it: a switch relaying or copying another node's frames here does not make them open)
        forged = Sealer(KEY_B, sci_of(MAC_2)).seal(frame(MAC_1, MAC_2, b"forged"))
        not_sealed = frame(MAC_1, MAC_2, b"plain" * 10)
        for unopened in (sealed_by_peer, forged, not_sealed, own_sealed[0]):
            w0.send(unopened)
            assert _next_test_frame(c0) == unopened
        # seal -> nothing: too large for the wire once sealed; from another source than the node's own (six bytes
        # of the host's choosing that would leave the pod readable); the engine goes on
        s0.send(frame(MAC_2, MAC_1, bytes(WIRE_MTU)))
        s0.send(frame(MAC_2, MAC_9, b"a source the host chose"))
        after = frame(MAC_2, MAC_1, b"after")
        s0.send(after)
        assert Opener(KEY_A).open(_next_test_frame(w0)) == after

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for sock in socks.values():
            sock.close()

    report = json.loads(stats.read_text())
    opener = report["opener"]
    counts = ("opened", "replayed", "rejected", "not_sealed", "not_addressed")
    assert tuple(opener[k] for k in counts) == (1, 1, 1, 1, 1)
    assert report["forwarded"] == {"clear->wire": 2, "seal->wire": 3, "wire->seal": 1, "wire->clear": 4}
    assert report["dropped"] == 2 and report["dropped_by_reason"] == {"too_large": 1, "not_own_source": 1}
    sent = sum(map(len, exempt)) + len(after)
    assert (report["sealed_frames"], report["sealed_bytes"]) == (3, sent)
    assert report["sent_bytes"] == {"02:00:01:00:00:02": sent}
    assert report["received_bytes"] == {"02:00:01:00:00:02": len(from_peer)}
    assert report["kernel_drops"] == 0


def test_the_engine_takes_its_key_only_from_stdin_and_never_echoes_it() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [LAB_PATH, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "dpu_lab.sealing", "--clear", "c1", "--seal", "s1", "--wire", "w1"]
    for line in ("", "not hex at all, and longer than thirty-two", KEY_A.hex()[:-2]):
        res = subprocess.run([*command, "--mac", "02:00:01:00:00:01"], input=line + "\n", env=env, **_TEXT)
        assert res.returncode == 2 and "32 hex digits" in res.stderr
        assert not line or line not in res.stderr
    res = subprocess.run([*command, "--mac", "02:00:01"], input=KEY_A.hex() + "\n", env=env, **_TEXT)
    assert res.returncode == 2 and "not a MAC address" in res.stderr
