"""What an adversarial caller found at the API (issue 13), each case a call that once got through or
answered wrong: the reply is the proto's status code, names the field, stays small, and nothing
stored changes."""

from __future__ import annotations

import datetime as dt
import logging
import re
import sqlite3
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.manifest import ManifestError, load_manifest
from dpu_limiter.models import MAX_POD_PREFIXES
from dpu_limiter.server import ControlPlane
from dpu_limiter.store import StateInUse
from dpu_limiter.tls import TlsFiles, init
from helpers.planes import plane_with_pod, register
from helpers.processes import free_port

pytestmark = pytest.mark.timeout(120)

Code = grpc.StatusCode


async def _snapshot(c: LimiterClient) -> tuple[object, ...]:
    pods = (await c.stub.ListPods(pb.ListPodsRequest())).pods
    dpus = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus
    routers = (await c.stub.ListRouters(pb.ListRoutersRequest())).routers
    return tuple(pods), tuple(dpus), tuple(routers), (await c.status()).generation


async def _refused(c: LimiterClient, call: object, code: Code, field: str) -> str:
    """`call` is refused with `code`, naming `field`, in a short message, with nothing stored changed."""
    before = await _snapshot(c)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    details = err.value.details() or ""
    assert err.value.code() == code, (err.value.code(), details)
    assert details.startswith(field), details
    assert len(details) <= 1024
    assert await _snapshot(c) == before
    return details


def _dpu(name: str = "d", address: str = "127.0.0.1:1", pod: str = "a", device_id: int = 1, mac: str = "") -> pb.Dpu:
    """A DPU of `pod` (a node DPU with node MAC `mac` if given, else a pod uplink)."""
    role = pb.DPU_ROLE_NODE if mac else pb.DPU_ROLE_UNSPECIFIED
    return pb.Dpu(name=name, p4runtime_address=address, device_id=device_id, pod=pod, role=role, node_mac=mac)


async def test_addresses_in_other_digits_scope_ids_and_bare_dashes_are_refused(db: str) -> None:
    """Item 1: '127.0.0.1:²' answered UNKNOWN (isdigit then int); '١٢٣', '-' and '%eth0' were stored."""
    async with plane_with_pod(db) as (_, c):
        for address in ("127.0.0.1:²", "127.0.0.1:١٢٣", "-:80", "[fe80::1%eth0]:80", "a..b:1", "-a.b:1", "a_b:1"):
            await _refused(c, c.register_dpu(_dpu(address=address)), Code.INVALID_ARGUMENT, "dpu.p4runtime_address")
        for i, address in enumerate(("localhost:9559", "[::1]:9559", "dpu-1.pod-a.example:9559", "10.9.0.1:1")):
            await c.register_dpu(_dpu(name=f"d{i}", address=address))


async def test_a_name_with_a_trailing_newline_is_not_a_second_name(db: str) -> None:
    """Item 2: `a\\n` passed the name pattern (`$` matches before a final newline)."""
    async with plane_with_pod(db) as (_, c):
        await _refused(c, c.apply_pod("a\n", ["10.0.2.0/24"]), Code.INVALID_ARGUMENT, "pod.name")
        await _refused(c, c.register_dpu(_dpu(name="d\n")), Code.INVALID_ARGUMENT, "dpu.name")
        await _refused(c, c.register_dpu(_dpu(pod="a\n")), Code.INVALID_ARGUMENT, "dpu.pod")
        router = pb.ApplyRequest(routers=[pb.Router(name="r\n", pods=["a"])])
        await _refused(c, c.stub.Apply(router), Code.INVALID_ARGUMENT, "routers[0].name")
        assert [p.name for p in (await c.stub.ListPods(pb.ListPodsRequest())).pods] == ["a"]


async def test_errors_repeat_a_bounded_part_of_a_huge_value(db: str) -> None:
    """Item 3: a 16 kB name turned INVALID_ARGUMENT into RESOURCE_EXHAUSTED (the error echoed it all)."""
    async with plane_with_pod(db) as (_, c):
        for huge in ("a" * 16_384, "é" * 10_000, "x" * 1_000_000):
            details = await _refused(c, c.apply_pod(huge, ["10.0.2.0/24"]), Code.INVALID_ARGUMENT, "pod.name")
            assert f"({len(huge)} chars)" in details
            await _refused(c, c.set_pod_cap(huge, 1e9, 1e9, 60.0), Code.NOT_FOUND, "pod")
            await _refused(c, c.stub.Delete(pb.DeleteRequest(dpus=[huge])), Code.NOT_FOUND, "dpus[0]")
            await _refused(c, c.register_dpu(_dpu(address=huge)), Code.INVALID_ARGUMENT, "dpu.p4runtime_address")
        # A refusal that lists names (a pod's DPUs) stays bounded too.
        many = [_dpu(name=f"dpu-{i:04d}-{'x' * 40}", device_id=i) for i in range(200)]
        await c.stub.Apply(pb.ApplyRequest(dpus=many))
        details = await _refused(c, c.stub.Delete(pb.DeleteRequest(pods=["a"])), Code.INVALID_ARGUMENT, "pods[0]")
        assert "chars in all" in details


async def test_bytes_that_are_not_the_request_message_are_invalid_argument(db: str) -> None:
    """Item 4: b'\\xff\\xff\\xff\\xff' to ApplyPod answered UNKNOWN with a server traceback; so for every RPC."""
    async with plane_with_pod(db) as (plane, c):
        service = pb.DESCRIPTOR.services_by_name["Limiter"]
        assert len(service.methods) == 12
        for method in service.methods:
            path = f"/limiter.v1.Limiter/{method.name}"
            for junk in (b"\xff\xff\xff\xff", b"\x0a\x05\xff", b"\x08"):  # bad wire type, cut short
                if method.server_streaming:
                    stream = c.channel.unary_stream(path)(junk)
                    call = anext(aiter(stream))
                else:
                    call = c.channel.unary_unary(path)(junk)
                details = await _refused(c, call, Code.INVALID_ARGUMENT, "request: not a valid limiter.v1.")
                assert method.input_type.full_name in details
        assert await plane.service.wait_converged(5)


async def test_status_codes_are_the_protos(db: str) -> None:
    """Item 5: duplicates answered INVALID_ARGUMENT (never ALREADY_EXISTS); unknown references too (not NOT_FOUND)."""
    async with plane_with_pod(db) as (_, c):
        await c.register_dpu(_dpu())
        await _refused(c, c.register_dpu(_dpu(address="127.0.0.1:2")), Code.ALREADY_EXISTS, "dpu.name")
        await _refused(c, c.register_dpu(_dpu(name="e")), Code.ALREADY_EXISTS, "dpu.p4runtime_address")
        await _refused(c, c.set_pod_cap("nosuch", 1e9, 1e9, 60.0), Code.NOT_FOUND, "pod")
        await _refused(c, c.register_dpu(_dpu(name="e", pod="nosuch")), Code.NOT_FOUND, "dpu.pod")
        routers = pb.ApplyRequest(routers=[pb.Router(name="r", pods=["a", "nosuch"])])
        await _refused(c, c.stub.Apply(routers), Code.NOT_FOUND, "routers[0].pods")
        await _refused(c, c.stub.GetPodCap(pb.GetPodCapRequest(pod="nosuch")), Code.NOT_FOUND, "pod")
        await _refused(c, c.stub.GetUsage(pb.GetUsageRequest(pod="nosuch")), Code.NOT_FOUND, "pod")
        await _refused(c, c.stub.Delete(pb.DeleteRequest(caps=["a"])), Code.NOT_FOUND, "caps[0]")
        # Naming one object twice in one request is a malformed request, not a clash with what is stored.
        twice = pb.ApplyRequest(pods=[pb.Pod(name="b", ipv4_prefixes=["10.0.2.0/24"])] * 2)
        await _refused(c, c.stub.Apply(twice), Code.INVALID_ARGUMENT, "pods[1].name")


async def test_two_new_dpus_of_one_endpoint_or_mac_blame_the_later_one(db: str) -> None:
    """A red team: dpus[999] taking dpus[5]'s endpoint was answered as dpus[5] being 'already registered as'
    dpus[999]'s DPU, which was in no store. The later field is at fault, and the message says where the other is."""
    async with plane_with_pod(db) as (_, c):
        await c.register_dpu(_dpu("stored", "127.0.0.1:9", device_id=9))
        dpus = [_dpu(f"n{i:02d}", "127.0.0.1:1", device_id=100 + i) for i in range(12)]
        dpus[11].device_id = dpus[2].device_id  # index 11 after index 2 (as text, "dpus[11]" < "dpus[2]")
        details = await _refused(c, c.stub.Apply(pb.ApplyRequest(dpus=dpus)), Code.ALREADY_EXISTS, "dpus[11].")
        assert "also given to DPU 'n02' at dpus[2] with device id 102" in details, details
        dpus[11].device_id = 111
        for k in (3, 10):
            dpus[k].role, dpus[k].node_mac = pb.DPU_ROLE_NODE, "02:00:00:00:00:0a"
        details = await _refused(c, c.stub.Apply(pb.ApplyRequest(dpus=dpus)), Code.ALREADY_EXISTS, "dpus[10].node_mac")
        assert "also given to DPU 'n03' at dpus[3]" in details, details
        dpus[10].node_mac = "02:00:00:00:00:0b"
        dpus[7].p4runtime_address, dpus[7].device_id = "127.0.0.1:9", 9  # a stored DPU's endpoint: as before
        details = await _refused(c, c.stub.Apply(pb.ApplyRequest(dpus=dpus)), Code.ALREADY_EXISTS, "dpus[7].")
        assert "already registered as DPU 'stored' with device id 9" in details, details
        dpus[7].p4runtime_address, dpus[7].device_id = "127.0.0.1:1", 107
        assert len((await c.stub.Apply(pb.ApplyRequest(dpus=dpus))).changes) == 12
        # A stored DPU updated in the same write (listed after the newcomer) keeps what it held: the newcomer is
        # at fault, for its endpoint and for its node MAC (a review: the stored one was blamed by position).
        await c.register_dpu(_dpu("node", "127.0.0.1:8", device_id=8, mac="02:00:00:00:00:08"))
        stored = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus
        node = next(d for d in stored if d.name == "node")
        node.uplink_port = node.host_port + 5  # an update that keeps its endpoint and MAC
        newcomer = _dpu("z", "127.0.0.1:8", device_id=8)
        details = await _refused(
            c, c.stub.Apply(pb.ApplyRequest(dpus=[newcomer, node])), Code.ALREADY_EXISTS, "dpus[0]."
        )
        assert "already registered as DPU 'node' with device id 8" in details, details
        newcomer = _dpu("m", "127.0.0.1:7", device_id=7, mac="02:00:00:00:00:08")
        details = await _refused(
            c, c.stub.Apply(pb.ApplyRequest(dpus=[newcomer, node])), Code.ALREADY_EXISTS, "dpus[0].node_mac"
        )
        assert "already the node MAC of DPU 'node'" in details, details


async def test_dpus_that_leave_unfloored_are_warned_of_once_a_write(db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A red team: deleting DPUs that could not be floored logged a line per DPU (148,000 lines in 4 minutes of
    churn). One line a write, with the count and the first names."""
    async with plane_with_pod(db) as (_, c):
        await c.set_pod_cap("a", 8e6, 8e6, 1.0)
        names = [f"u{i}" for i in range(8)]
        for name in names:  # at closed ports: never connected, so never floored
            await register(c, name, f"127.0.0.1:{free_port()}")
        caplog.set_level(logging.INFO, logger="dpu_limiter.service")
        await c.stub.Delete(pb.DeleteRequest(dpus=names))
        said = [r for r in caplog.records if "without being floored" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
        assert "8 DPU(s) left without being floored (u0, u1, u2, u3, u4 and 3 more)" in said[0].getMessage()


async def test_caps_that_mean_nothing_are_refused_before_any_dpu(db: str) -> None:
    """Item 7: on a pod without DPUs, 1 bit/s (0 bytes/s) and a window of 5e-324 s were stored; a later
    RegisterDpu was then refused blaming its buffer."""
    async with plane_with_pod(db) as (_, c):
        await _refused(c, c.set_pod_cap("a", 1, 1e9, 60.0), Code.INVALID_ARGUMENT, "cap.egress_bps")
        await _refused(c, c.set_pod_cap("a", 1e9, 8_000, 60.0), Code.INVALID_ARGUMENT, "cap.ingress_bps")
        await _refused(c, c.set_pod_cap("a", 1e9, 1e9, 5e-324), Code.INVALID_ARGUMENT, "cap.window_s")
        await _refused(
            c, c.set_pod_cap("a", 1e9, 1e9, 60.0, burst_bytes=2000), Code.INVALID_ARGUMENT, "cap.burst_bytes"
        )
        await _refused(c, c.set_pod_cap("a", 20e3, 20e3, 1.0, mode="window"), Code.INVALID_ARGUMENT, "cap.window_s")
        await c.set_pod_cap("a", 1e6, 1e6, 1.0, burst_bytes=20_000)
        await c.register_dpu(_dpu())  # a cap a DPU without a buffer can hold is one a DPU can be added under


async def test_prefixes_no_pod_can_own_are_refused(db: str) -> None:
    """Item 8: 0.0.0.0/0 (all of IPv4 then intra-pod), loopback, multicast, link-local, broadcast were stored."""
    async with plane_with_pod(db) as (_, c):
        for prefix in (
            "0.0.0.0/0",
            "127.0.0.0/8",
            "224.0.0.0/4",
            "169.254.0.0/16",
            "255.255.255.255/32",
            "0.0.0.0/32",
            "240.0.0.0/8",
            "\uff110.0.2.0/24",  # a fullwidth digit one
        ):
            await _refused(c, c.apply_pod("b", [prefix]), Code.INVALID_ARGUMENT, "pod.ipv4_prefixes[0]")
        await c.apply_pod("b", ["10.0.2.0/24", "192.168.0.0/16"])


def _two_ou_certificate(pki: Path) -> TlsFiles:
    """A client certificate of the lab CA whose subject has two OUs: verifier and operator."""
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "both"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "verifier"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "operator"),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (pki / "both.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (pki / "both.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return TlsFiles(pki / "ca.pem", pki / "both.pem", pki / "both.key")


async def test_a_certificate_with_two_roles_has_none(tmp_path: Path, db: str) -> None:
    """Item 13: OU=[verifier, operator] took its role from the first OU and could write."""
    pki = tmp_path / "pki"
    files = init(pki, ["127.0.0.1", "localhost"])
    plane = ControlPlane(db, "127.0.0.1:0", tls=files["server"])
    await plane.start()
    try:
        async with LimiterClient(f"localhost:{plane.port}", _two_ou_certificate(pki)) as c:
            for call in (c.apply_pod("a", ["10.0.1.0/24"]), c.status()):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == Code.PERMISSION_DENIED
                assert "exactly one OU" in (err.value.details() or "")
        assert not plane.service.state.pods
    finally:
        await plane.stop()


async def test_one_endpoint_has_one_spelling(db: str) -> None:
    """Review: 127.0.0.1:09559, [::ffff:127.0.0.1]:9559 or 0.0.0.0:9559 registered a second DPU on one device."""
    async with plane_with_pod(db) as (_, c):
        await c.apply_pod("b", ["10.0.2.0/24"])
        assert (await c.register_dpu(_dpu(address="127.0.0.1:9559"))).p4runtime_address == "127.0.0.1:9559"
        await _refused(
            c, c.register_dpu(_dpu("e", "127.0.0.1:09559", "b")), Code.ALREADY_EXISTS, "dpu.p4runtime_address"
        )
        for address in ("[::ffff:127.0.0.1]:9559", "0.0.0.0:9559", "[::]:9559", "255.255.255.255:1", "0x7f.0.0.1:1"):
            await _refused(c, c.register_dpu(_dpu("e", address, "b")), Code.INVALID_ARGUMENT, "dpu.p4runtime_address")
        assert (await c.register_dpu(_dpu("e", "LocalHost.:9559", "b"))).p4runtime_address == "localhost:9559"
        await _refused(
            c, c.register_dpu(_dpu("f", "localhost:9559", "b")), Code.ALREADY_EXISTS, "dpu.p4runtime_address"
        )


async def test_a_second_control_plane_on_one_state_file_is_refused(tmp_path: Path) -> None:
    """Review: a second server on the same file wrote from its own stale copy (two pods got one prefix). (A
    SQLite file's own: on PostgreSQL a second control plane is a replica, test_replicas.py.)"""
    async with plane_with_pod(tmp_path / "state.db") as (plane, _):
        with pytest.raises(StateInUse, match="in use by another control plane"):
            ControlPlane(plane.store.path, "127.0.0.1:0")
    ControlPlane(plane.store.path, "127.0.0.1:0").store.close()  # the first one stopped: free again


async def test_a_locked_state_file_is_unavailable_not_unknown(tmp_path: Path) -> None:
    """Review: an operator's sqlite shell holding a write transaction made writes answer UNKNOWN."""
    async with plane_with_pod(tmp_path / "state.db") as (plane, c):
        other = sqlite3.connect(plane.store.path, timeout=0)
        other.execute("BEGIN IMMEDIATE")
        try:
            await _refused(c, c.apply_pod("b", ["10.0.2.0/24"]), Code.UNAVAILABLE, "the control plane's state store")
        finally:
            other.rollback()
            other.close()
        await c.apply_pod("b", ["10.0.2.0/24"])


def test_a_file_may_not_turn_numbers_into_names_or_foreign_digits_into_rates(tmp_path: Path) -> None:
    """Review: unquoted `name: 0x10` stored pod "16"; Arabic-Indic digits "12G" stored 12 Gbit/s."""
    cases = {
        "pods: [{name: 0x10, ipv4_prefixes: [10.0.1.0/24]}]": "pods[0].name: must be a string",
        'pods: [{name: a, ipv4_prefixes: [10.0.1.0/24]}]\ncaps: [{pod: a, egress: "\\u0661\\u0662G", '
        "ingress: 1G, window_s: 2}]": "caps[0].egress",
        "pods: [{name: a, ipv4_prefixes: [10.0.1.0/24]}]\ndpus: [{name: 1.10, p4runtime_address: '127.0.0.1:1', "
        "device_id: 1, pod: a}]": "dpus[0].name: must be a string",
    }
    for i, (text, expect) in enumerate(cases.items()):
        path = tmp_path / f"m{i}.yaml"
        path.write_text(text)
        with pytest.raises(ManifestError, match=re.escape(expect)):
            load_manifest(path)


async def test_more_prefixes_than_the_data_plane_holds_are_refused(db: str) -> None:
    """Review: a pod of 2,000 prefixes was accepted; limiter.p4's prefix tables hold 1,024."""
    async with plane_with_pod(db) as (_, c):
        many = [f"10.{8 + i // 256}.{i % 256}.0/24" for i in range(MAX_POD_PREFIXES + 1)]
        await _refused(c, c.apply_pod("b", many), Code.INVALID_ARGUMENT, "pod.ipv4_prefixes")
        await c.apply_pod("b", many[:MAX_POD_PREFIXES])
