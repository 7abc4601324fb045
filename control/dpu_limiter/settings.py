"""The control plane's settings: one frozen object, from `serve`'s flags (or a test, or the lab) down to the
service and its agents."""

from __future__ import annotations

from dataclasses import dataclass, field

from .clock import WALL, Clock
from .dataplane import ProgramFiles
from .reconciler import ELECTION_ID, Concurrency
from .tls import TlsFiles
from .units import BACKUP_STREAMS, DEFAULT_LEASE_S, PIPELINE_CHECK_S, POLL_S, REPLICA_LEASE_S, RESYNC_S


@dataclass(frozen=True)
class Settings:
    """How the control plane runs (the API's own listener, TLS and metrics are the server's: server.py)."""

    program: ProgramFiles | None = None  # the P4 program DPUs run (None: limiter.p4 as shipped)
    p4runtime_tls: TlsFiles | None = None  # client certificate for the DPUs' P4Runtime servers (None: plaintext)
    election_id: int = ELECTION_ID  # the control plane's bid for primary on every DPU
    # Every DPU with a cap holds a lease of `lease_s`, renewed every third of it; without the lease loop the
    # caller renews (virtual time).
    lease_s: float = DEFAULT_LEASE_S
    lease_loop: bool = True
    resync_s: float = RESYNC_S  # read-back period of a DPU when nothing changes
    pipeline_check_s: float = PIPELINE_CHECK_S  # how often a DPU's pipeline is hashed (0: only when reads fail)
    # Rebalancing pods move shares by demand every interval; without the loop the caller does (virtual time).
    rebalance_interval_s: float = 2.0
    rebalance_loop: bool = True
    concurrency: Concurrency = field(default_factory=Concurrency)  # DPUs worked on at once
    clock: Clock = WALL  # the policy's time: leases, holds, periods (a simulation gives its own)
    # Replicas (PostgreSQL only: replicas.py): this one's id ("": host, process id and a random part), the API
    # address the others name it by ("": the one it listens on), its lease in the database, how often it polls,
    # and how many replicas after each pod's holder keep backup streams to its DPUs.
    replica_id: str = ""
    advertise: str = ""
    replica_lease_s: float = REPLICA_LEASE_S
    replica_poll_s: float = POLL_S
    backup_streams: int = BACKUP_STREAMS
