"""The verifier as a site runs it, beside a real-time lab run with an audit.

The router's namespace runs Debian's snmpd, bound to the router's own address on a management link
(netns.LabNetwork.add_management) and read-only for one community, from the verifier's address alone:
its IF-MIB octet counters are the kernel's counts of the router's ports. `dpu-limiter verify` runs as a
process of its own in the root namespace, with a config the lab writes as an operator would: the control
plane's API, the router's SNMP agent and which of its ports faces which pod, a signing key made for the
run. It knows nothing of the lab. At the end the lab stops it (SIGTERM: it closes its evidence bundle),
reads its alert lines, checks its bundle offline (`evidence verify`'s code) and puts both in the report
(`report.verifier`), with the time each alert came on the run's time base.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dpu_verifier.evidence import generate_key, load_public_key, verify_bundle

from .config import Scenario
from .netns import LabNetwork
from .processes import stop_processes

SNMPD = shutil.which("snmpd") or ("/usr/sbin/snmpd" if os.path.exists("/usr/sbin/snmpd") else None)
MIN_INTERVAL_S = 1.0  # the verifier's shortest interval (dpu_verifier.service.MIN_INTERVAL_S)
SAMPLE_S = 0.5
# net-snmp's agent refreshes its interface counters every 3 s (seen here: they move in steps 3 s apart),
# so a reading is up to that, plus a sample, behind the wire: the verifier's counter_lag_s.
COUNTER_LAG_S = 3.0 + SAMPLE_S
STOP_S = 20.0  # how long the verifier may take to close its bundle after SIGTERM
# An alert line: "2026-12-03 10:00:00,123 ERROR dpu_verifier: ALERT t=12.0s check=... place=... detail"
# (a place is a pod and a direction, or one name).
ALERT = re.compile(r"^(\S+ \S+) ERROR \S+: ALERT t=\S+ check=(\S+) place=(\S+(?: (?:egress|ingress))?) (.*)$")


def missing() -> str | None:
    """Why the site's verifier cannot run here (None: it can)."""
    return None if SNMPD is not None else "snmpd (Debian's snmpd package) is not installed"


@dataclass
class LabSite:
    """snmpd in the router's namespace and `dpu-limiter verify` beside the run; `start()`, then `finish()`."""

    scenario: Scenario
    net: LabNetwork
    api: str  # the control plane's API
    folder: Path  # the run's raw/ folder: configs, logs, key, evidence
    t_start: float  # the run's time zero (time.time())
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _community: str = field(default_factory=lambda: secrets.token_hex(8), repr=False)
    _public: Path | None = None  # the verifier's public key

    @property
    def _dir(self) -> Path:
        return self.folder / "verifier"

    def start(self) -> None:
        """Start snmpd in the router's namespace and the verifier (which waits for its first interval)."""
        assert SNMPD is not None and self.scenario.audit is not None
        d = self._dir
        d.mkdir(parents=True, exist_ok=True)
        root_ip, router_ip = self.net.add_management()
        snmp = d / "snmpd"
        snmp.mkdir(exist_ok=True)
        (snmp / "snmpd.conf").write_text(f"rocommunity {self._community} {root_ip}\n")
        env = {**os.environ, "MIBS": "", "SNMP_PERSISTENT_DIR": str(snmp)}
        cmd = ["ip", "netns", "exec", self.net.router_ns, SNMPD, "-f", "-Lf", str(snmp / "log"), "-C"]
        cmd += ["-c", str(snmp / "snmpd.conf"), f"udp:{router_ip}:161"]
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._public = generate_key(d / "verifier.key")
        audit = self.scenario.audit
        config = {
            "control_plane": self.api,
            "routers": [
                {
                    "name": "router",
                    "snmp": f"{router_ip}:161",
                    "community": self._community,
                    "ports": {port: pod for pod, port in self.net.router_ports.items()},
                }
            ],
            "evidence": str(d / "evidence"),
            "key": str(d / "verifier.key"),
            "interval_s": max(MIN_INTERVAL_S, audit.interval_s),
            "sample_s": SAMPLE_S,
            "counter_lag_s": COUNTER_LAG_S,
            "checks": [c for c in audit.checks if c != "probe"],  # probe agents: not started by the lab yet
        }
        (d / "verify.yaml").write_text(yaml.safe_dump(config))
        with (d / "verify.log").open("wb") as log:
            cmd = [sys.executable, "-m", "dpu_limiter.cli", "verify", "--config", str(d / "verify.yaml")]
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        """Stop the verifier (SIGTERM: it closes its bundle), then snmpd; by their handles."""
        for p in reversed(self.procs):  # one at a time: snmpd still answers while the verifier closes its bundle
            stop_processes(p, timeout=STOP_S)
        self.procs.clear()

    def finish(self, compromised_at: float | None) -> dict[str, Any]:
        """Stop; the verifier's alerts on the run's time base, whether it caught a compromise at
        `compromised_at` (run seconds) and how fast, and its bundle checked offline."""
        self.stop()
        assert self._public is not None
        alerts: list[dict[str, Any]] = []
        for line in (self._dir / "verify.log").read_text(errors="replace").splitlines():
            if m := ALERT.match(line):
                when = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - self.t_start
                alerts.append({"t_s": round(when, 2), "check": m[2], "where": m[3], "detail": m[4]})
        out: dict[str, Any] = {"alerts": alerts}
        if compromised_at is None:
            out["false_alarms"] = len(alerts)
        else:
            after = [a for a in alerts if a["t_s"] >= compromised_at]
            out["false_alarms"] = len(alerts) - len(after)
            out["detected"] = bool(after)
            out["time_to_detection_s"] = round(after[0]["t_s"] - compromised_at, 2) if after else None
            out["detected_by"] = sorted({a["check"] for a in after})
        bundles = sorted((self._dir / "evidence").glob("*")) if (self._dir / "evidence").exists() else []
        key = load_public_key(self._public)
        out["evidence"] = []
        for bundle in bundles:
            check = verify_bundle(bundle, key)
            out["evidence"].append(
                {
                    "bundle": str(bundle),
                    "verified": check.ok,
                    "windows": check.windows,
                    "verdicts": check.verdicts,
                    "problem": check.problem,
                }
            )
        return out
