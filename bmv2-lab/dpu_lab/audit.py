"""What the lab gives the verifier's checks (dpu_verifier.checks), in both clocks: the caps they judge
(`scope`), how often the control plane reads its DPUs back for them (`read_back_s`), the probes' ports.

The checks see the DPUs only through the control plane's API (ApiView), as at a site; the lab feeds
them its own router's counts (the simulator's in virtual time, the boundary capture's in real time).
"""

from __future__ import annotations

from dpu_verifier.checks import CapScope

from .config import Scenario

PROBE_PORT = 60000  # the verifier's probes (one port per capped pod)
# The control plane reads every DPU back (and hashes its pipeline) this many times per audit interval
# (each period jittered by up to a fifth): a DPU tampered with is corrected, and its correction shown
# through the API, before the audit's next tick.
READ_BACKS_PER_INTERVAL = 2.5


def read_back_s(sc: Scenario) -> float | None:
    """How often the control plane reads DPUs back for the scenario's audit (None: no audit, its default)."""
    return sc.audit.interval_s / READ_BACKS_PER_INTERVAL if sc.audit is not None else None


def scope(sc: Scenario) -> list[CapScope]:
    """The scenario's caps as the checks judge them: each at the largest rates it takes during the run."""
    return [CapScope(c.pod, *sc.peak_rates(c.pod), c.window_s, c.bucket_bytes(), c.mode) for c in sc.caps]
