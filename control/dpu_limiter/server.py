"""Running the control plane: a gRPC server over the service, in-process or as `dpu-limiter serve`."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import grpc

from . import api
from .metrics import MetricsEndpoint
from .replicas import Replicas, default_id
from .service import LimiterService
from .settings import Settings
from .store import StateMismatch
from .stores import open_store
from .tls import TlsFiles
from .units import API_KEEPALIVE_S, GRPC_MESSAGE_OPTIONS, KEEPALIVE_TIMEOUT_S

LOG = logging.getLogger(__name__)


class ControlPlane:
    """The control plane's gRPC server and service, started and stopped as one."""

    def __init__(
        self,
        db_path: Path | str,  # a SQLite file, or a postgresql:// URL (stores.open_store)
        listen: str = "127.0.0.1:0",
        settings: Settings | None = None,
        metrics_listen: str | None = None,
        metrics_interval_s: float = 5.0,
        tls: TlsFiles | None = None,
        keepalive_s: float = API_KEEPALIVE_S,  # 0: no pings
    ) -> None:
        self.store = open_store(db_path, exclusive=True)
        # The tables are what the audit log says, or nothing is served from them: a row edited behind
        # the log (a cap raised in the file) would otherwise be enforced.
        try:
            verdict = self.store.verify_state()
        except BaseException:
            self.store.close()
            raise
        if not verdict.ok:
            self.store.close()
            raise StateMismatch(self.store.path, verdict)
        self.service = LimiterService(self.store, settings)
        # No SO_REUSEPORT (gRPC's default): a second control plane on a taken port must fail, not
        # share the port and answer every other request from its own state.
        keepalive = [
            ("grpc.keepalive_time_ms", round(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", round(KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 0),  # an idle connection is not pinged
            ("grpc.http2.max_pings_without_data", 0),  # no limit on pings with no data between (clients' is 2)
        ]
        self.server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), *GRPC_MESSAGE_OPTIONS, *(keepalive if keepalive_s > 0 else [])]
        )
        api.add_to_server(self.server, self.service, mtls=tls is not None)
        try:
            if tls is None:
                self.port = self.server.add_insecure_port(listen)
            else:
                ca, cert, key = tls.read()
                creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
                self.port = self.server.add_secure_port(listen, creds)
        except RuntimeError:  # gRPC's "Failed to bind"
            self.port = 0
        if self.port == 0:
            self.store.close()
            raise OSError(f"cannot listen on {listen} (in use, or not an address of this host)")
        self.address = f"{listen.rpartition(':')[0]}:{self.port}"
        # On a database that several control planes share (PostgreSQL), this one is a replica: it holds the
        # pods the live replicas' hashing gives it (replicas.py). On SQLite it holds every DPU, alone.
        self.replicas: Replicas | None = None
        if self.store.SHARED:
            s = self.service.settings
            try:
                self.replicas = Replicas(
                    self.service,
                    lambda: open_store(db_path),
                    s.replica_id or default_id(),
                    s.advertise or self.address,
                    s.replica_lease_s,
                    s.replica_poll_s,
                    s.backup_streams,
                )
            except ValueError:
                self.store.close()
                raise
        self.metrics_listen = metrics_listen
        self.metrics_interval_s = metrics_interval_s
        self.metrics: MetricsEndpoint | None = None

    async def start(self) -> None:
        """Start serving and reconciling."""
        await self.server.start()
        if self.replicas is not None:
            try:
                await self.replicas.start()  # starts the service on the DPUs this replica holds
            except BaseException:
                await self.stop()
                raise
        else:
            await self.service.start()
        if self.metrics_listen:
            try:
                self.metrics = MetricsEndpoint(self.service, self.metrics_listen, self.metrics_interval_s)
            except OSError as exc:
                await self.stop()
                raise OSError(f"metrics endpoint: cannot listen on {self.metrics_listen}: {exc.strerror}") from None

    async def quiet(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is left to do before the clock moves on (a simulation's clock: Settings.clock);
        whether that came within `timeout` s of wall time."""
        return await self.service.quiet(timeout)

    async def stop(self) -> None:
        """Stop serving, stop the agents, close the store."""
        if self.metrics is not None:
            await self.metrics.stop()
        await self.server.stop(grace=0.5)
        if self.replicas is not None:
            await self.replicas.stop()  # stops writing to DPUs first, then gives its lease up
        await self.service.stop()
        self.store.close()


async def serve(
    db_path: Path | str,
    listen: str,
    settings: Settings,
    metrics_listen: str | None = None,
    tls: TlsFiles | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM."""
    cp = ControlPlane(db_path, listen, settings, metrics_listen=metrics_listen, tls=tls)
    await cp.start()
    LOG.info("control plane listening on %s, state in %s", cp.address, cp.store.path)
    metrics = f", metrics on http://{metrics_listen}/metrics" if metrics_listen else ""
    replica = f", replica {cp.replicas.id} of {len(cp.replicas.live)} live" if cp.replicas is not None else ""
    print(f"dpu-limiter control plane listening on {cp.address} (state: {cp.store.path}{replica}){metrics}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await cp.stop()
