"""Mutual TLS and roles: the verifier writes, the operator only reads, strangers and expired
certificates are turned away; the control plane reaches DPUs over TLS P4Runtime; every change is
recorded with who made it."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.stores import read_audit
from dpu_limiter.tls import TlsFiles, init, issue
from helpers.planes import register
from helpers.processes import free_port, start_embedded, stop, wait_port

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init(d, ["127.0.0.1", "localhost"])
    issue(d, "stale", "verifier", days=1, not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    issue(d, "nobody", None)  # a client certificate without a role
    return d


def client_tls(d: Path, name: str) -> TlsFiles:
    return TlsFiles(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


async def test_roles_over_mutual_tls(tmp_path: Path, db: str, pki: Path) -> None:
    plane = ControlPlane(db, "127.0.0.1:0", tls=client_tls(pki, "server"))
    await plane.start()
    addr = f"localhost:{plane.port}"
    try:
        async with LimiterClient(addr, client_tls(pki, "verifier")) as v:
            await v.apply_pod("a", ["10.0.1.0/24"])
            await v.set_pod_cap("a", 1e9, 1e9, 60.0)
        async with LimiterClient(addr, client_tls(pki, "operator")) as op:
            assert (await op.get_pod_cap("a")).cap.egress_bps == 1e9  # reading is fine
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await op.set_pod_cap("a", 1e12, 1e12, 60.0)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "only read" in (err.value.details() or "")
        async with LimiterClient(addr, client_tls(pki, "nobody")) as nobody:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await nobody.status()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "no role" in (err.value.details() or "")
        for tls in (client_tls(pki, "stale"), None):  # expired certificate; no TLS at all
            async with LimiterClient(addr, tls) as c:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.status()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        async with LimiterClient(addr, client_tls(pki, "verifier")) as v:
            assert (await v.get_pod_cap("a")).cap.egress_bps == 1e9  # the refused writes changed nothing
    finally:
        await plane.stop()
    actors = {r.action: r.actor for r in read_audit(db)}
    assert actors == {"apply-pod": "verifier:verifier", "set-cap": "verifier:verifier"}


async def test_p4runtime_over_mutual_tls(tmp_path: Path, db: str, pki: Path) -> None:
    port = free_port()
    tls = [
        "--grpc-server-ssl",
        "--grpc-server-cacert",
        str(pki / "ca.pem"),
        "--grpc-server-cert",
        str(pki / "server.pem"),
        "--grpc-server-key",
        str(pki / "server.key"),
        "--grpc-server-with-client-auth",
    ]
    target = start_embedded(port, tmp_path / "target.log", tls)
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(p4runtime_tls=client_tls(pki, "verifier")))
    try:
        await plane.start()
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", f"127.0.0.1:{port}")
            await c.set_pod_cap("a", 20e6, 20e6, 10.0)
            status = await c.wait_converged(timeout=30)
            assert status.dpus[0].converged
        # Without a client certificate the DPU refuses the connection.
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}", grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        ) as ch:
            from finsy.proto import p4r, p4r_grpc

            with pytest.raises(grpc.aio.AioRpcError):
                await p4r_grpc.P4RuntimeStub(ch).Capabilities(p4r.CapabilitiesRequest(), timeout=5)  # type: ignore[no-untyped-call]
    finally:
        await plane.stop()
        stop(target)


def test_certs_cli(tmp_path: Path, db: str) -> None:
    d = tmp_path / "pki"
    res = subprocess.run(
        [sys.executable, "-m", "dpu_limiter.cli", "certs", "init", str(d)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert all((d / f).is_file() for f in ("ca.pem", "server.pem", "server.key", "verifier.pem", "operator.key"))
    res = subprocess.run(
        [sys.executable, "-m", "dpu_limiter.cli", "certs", "issue", str(d), "auditor-2", "--role", "operator"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and (d / "auditor-2.pem").is_file()
    port = free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "serve",
            "--db",
            db,
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-dir",
            str(d),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, serve)
        base = [sys.executable, "-m", "dpu_limiter.cli"]
        ok = subprocess.run(
            [*base, "apply", "-f", "/dev/stdin", "--server", f"127.0.0.1:{port}", "--tls-dir", str(d)],
            input="pods: [{name: a, ipv4_prefixes: [10.0.1.0/24]}]\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
        denied = subprocess.run(
            [
                *base,
                "cap",
                "set",
                "a",
                "--egress",
                "1G",
                "--ingress",
                "1G",
                "--window",
                "60",
                "--server",
                f"127.0.0.1:{port}",
                "--tls-dir",
                str(d),
                "--as",
                "operator",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr
    finally:
        stop(serve)


async def test_unauthorised_writes_are_refused_the_same_on_every_replica(pg_url: str, pki: Path) -> None:
    """Two replicas on one PostgreSQL database, mutual TLS: a read-only operator's write, a certificate without a
    role and an expired one get the same answer from each, and nothing they sent is stored; the verifier's write
    through one is read through the other."""
    planes = [ControlPlane(pg_url, "127.0.0.1:0", tls=client_tls(pki, "server")) for _ in range(2)]
    try:
        for p in planes:
            await p.start()
        addresses = [f"localhost:{p.port}" for p in planes]
        async with LimiterClient(addresses[0], client_tls(pki, "verifier")) as v:
            await v.apply_pod("a", ["10.0.1.0/24"])
            await v.set_pod_cap("a", 1e9, 1e9, 60.0)
        answers: dict[str, set[tuple[grpc.StatusCode, str]]] = {"operator": set(), "nobody": set(), "stale": set()}
        for addr in addresses:
            for who in answers:
                async with LimiterClient(addr, client_tls(pki, who)) as c:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await c.set_pod_cap("a", 1e12, 1e12, 60.0)
                    code = err.value.code()
                    # An expired certificate fails the handshake: gRPC's own text names the peer, so only the code.
                    answers[who].add((code, "" if code == grpc.StatusCode.UNAVAILABLE else err.value.details() or ""))
            async with LimiterClient(addr, client_tls(pki, "operator")) as op:
                assert (await op.get_pod_cap("a")).cap.egress_bps == 1e9  # written through the first, read here
        assert {who: len(a) for who, a in answers.items()} == {"operator": 1, "nobody": 1, "stale": 1}, answers
        assert [code for (code, _) in answers["operator"] | answers["nobody"]] == [
            grpc.StatusCode.PERMISSION_DENIED
        ] * 2
        assert {code for code, _ in answers["stale"]} == {grpc.StatusCode.UNAVAILABLE}
    finally:
        for p in planes:
            await p.stop()
    assert {r.actor for r in read_audit(pg_url)} == {"verifier:verifier"}
