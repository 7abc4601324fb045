"""A Prometheus endpoint: usage per pod, direction, class and colour, and each DPU's convergence.

Counters are read from the DPUs by a background task (not in the scrape), so a scrape never waits
on a slow DPU; it serves the latest sample.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .service import ELSEWHERE, LimiterService
from .usage import DirectionUsage

LOG = logging.getLogger(__name__)
BYTE_FIELDS = (
    "exempt_bytes",
    "metered_bytes",
    "green_bytes",
    "yellow_bytes",
    "red_bytes",
    "other_bytes",
    "fragment_bytes",
    "window_bytes",
    "lease_bytes",
    "spoofed_bytes",
    "intra_bytes",
    "arp_bytes",
    "arp_dropped_bytes",
)


class UsageCollector(Collector):
    """Turns the latest usage sample and agent statuses into metric families."""

    def __init__(self, service: LimiterService) -> None:
        self.service = service
        # Taken on the event loop (refresh), read by the HTTP thread: collect() touches no live state.
        self.sample: list[DirectionUsage] = []
        self.dpus: list[tuple[str, bool, bool, bool]] = []  # (name, connected, converged, lease held)
        self.generation = 0

    def take(self, sample: list[DirectionUsage]) -> None:
        """Snapshot the usage sample and every DPU's status (on the event loop)."""
        self.dpus = [
            (r.name, r.connected, r.converged, r.lease_state in ("held", "renewing"))
            for r in self.service.status()
            if r.lease_state != ELSEWHERE  # another replica holds it: its own metrics show it
        ]
        self.generation = self.service.state.generation
        self.sample = sample

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Metric families for one scrape."""
        by_kind = CounterMetricFamily(
            "dpu_limiter_boundary_bytes",
            "Bytes across a pod's boundary, summed over its DPUs' counters",
            labels=["pod", "direction", "kind"],
        )
        by_dpu = CounterMetricFamily(
            "dpu_limiter_dpu_bytes",
            "Bytes one DPU (a node's, with node placement) passed or dropped at its pod's boundary",
            labels=["dpu", "pod", "direction", "kind"],
        )
        for u in self.sample:
            # Counters must not fall: a total missing a DPU, or a DPU not read, is left out of the scrape.
            if u.error or u.dpus_unread:
                continue
            for f in BYTE_FIELDS:
                kind = f.removesuffix("_bytes")
                if u.dpu:
                    by_dpu.add_metric([u.dpu, u.pod, u.direction, kind], getattr(u, f))
                else:
                    by_kind.add_metric([u.pod, u.direction, kind], getattr(u, f))
        yield by_kind
        yield by_dpu
        connected = GaugeMetricFamily(
            "dpu_limiter_dpu_connected", "1 when the control plane holds a stream", labels=["dpu"]
        )
        converged = GaugeMetricFamily(
            "dpu_limiter_dpu_converged", "1 when the DPU read back as desired", labels=["dpu"]
        )
        lease = GaugeMetricFamily(
            "dpu_limiter_dpu_lease_held",
            "1 while the DPU holds a lease the control plane confirmed within its lifetime (held or renewing)",
            labels=["dpu"],
        )
        for name, is_connected, is_converged, held in self.dpus:
            connected.add_metric([name], float(is_connected))
            converged.add_metric([name], float(is_converged))
            lease.add_metric([name], float(held))
        yield connected
        yield converged
        yield lease
        gen = GaugeMetricFamily("dpu_limiter_generation", "Generation of the desired state")
        gen.add_metric([], float(self.generation))
        yield gen


class MetricsEndpoint:
    """The HTTP endpoint and the task that refreshes its sample."""

    def __init__(self, service: LimiterService, listen: str, interval_s: float = 5.0) -> None:
        self.collector = UsageCollector(service)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        host, _, port = listen.rpartition(":")
        self.server: WSGIServer
        self.server, self._thread = start_http_server(int(port), host or "0.0.0.0", self.registry)
        self.port = self.server.server_port
        self.interval_s = interval_s
        self._task = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        while True:
            try:
                self.collector.take(await self.collector.service.usage(per_dpu=True))
            except Exception as exc:
                LOG.warning("metrics refresh failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        """Stop refreshing and serving."""
        self._task.cancel()
        self.server.shutdown()
        self.server.server_close()
