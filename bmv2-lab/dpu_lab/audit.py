"""The verifier's checks (dpu_verifier.checks) in a virtual-time lab run: fed by the simulator's router and
by the control plane's own agents in process, so read-back includes each pipeline's hash.

Every `interval_s` of simulated time (the simulation paused, so every figure is one instant's), the
checks run as they do at a site; see dpu_verifier/checks.py. The lab's scenario gives the caps they
judge (`scope`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpu_limiter.reconciler import DpuAgent
from dpu_verifier.checks import CapScope, Facts, api_facts

from .config import Scenario

PROBE_PORT = 60000  # the verifier's probes (one port per capped pod)
READ_BACK_TIMEOUT_S = 30.0


def scope(sc: Scenario) -> list[CapScope]:
    """The scenario's caps as the checks judge them: each at the largest rates it takes during the run."""
    return [CapScope(c.pod, *sc.peak_rates(c.pod), c.window_s, c.bucket_bytes(), c.mode) for c in sc.caps]


@dataclass
class AgentView:
    """The control plane's own agents, in process (virtual time): read-back includes the pipeline's hash."""

    agents: dict[str, DpuAgent]
    address: str  # the control plane's API, for the evidence's facts
    _drift: dict[str, int] = field(default_factory=dict)

    async def facts(self) -> Facts:
        """Through the API, as a verifier beside the control plane would read them."""
        return await api_facts(self.address)

    async def read_back(self) -> list[tuple[str, str]]:
        """Hash each DPU's pipeline and read its entries and meters back; reinstall or correct."""
        found = []
        for name, agent in self.agents.items():
            if not agent.status.connected:
                continue  # down or restarting: nothing to read back now (the control plane reprograms it)
            held = await agent.pipeline_digest()
            if held != agent.expected_digest():
                found.append((name, f"runs another pipeline (sha256 {held[:16]}...); reinstalled"))
                await agent.reinstall_pipeline()
            before = self._drift.get(name, agent.status.drift_corrections)
            await agent.wait_applied(agent.poke(), READ_BACK_TIMEOUT_S)
            self._drift[name] = agent.status.drift_corrections
            if agent.status.drift_corrections > before:
                # The reconciler's message starts with a wall-clock stamp; the alert has the run's time.
                found.append((name, agent.status.last_drift.partition(": ")[2]))
        return found

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Each DPU's counters, read over P4Runtime by its agent."""
        out: dict[str, tuple[str, tuple[int, int] | None]] = {}
        for name, agent in self.agents.items():
            try:
                out[name] = (agent.dpu.pod, passed_and_metered(await agent.read_usage()))
            except Exception:  # a DPU down or restarting: its pod's balance cannot be drawn this time
                out[name] = (agent.dpu.pod, None)
        return out


def passed_and_metered(usage: dict[str, dict[str, tuple[int, int]]]) -> tuple[int, int]:
    """Bytes passed out (green, yellow, and ARP its own meter passed) and bytes that reached a meter on
    the way in (passed, or dropped by the meter, the window budget, for want of a lease; all ARP)."""
    egress, ingress = usage["egress"], usage["ingress"]
    out = egress["green"][1] + egress["yellow"][1] + egress["arp"][1] - egress["arp_red"][1]
    into = sum(ingress[c][1] for c in ("green", "yellow", "red", "window", "lease", "arp"))
    return out, into
