"""Building the lab network from a topology: namespaces, veth pairs, a bridge per pod, a router.

Layout for a pod P (index i) with a pod-uplink limiter:

    host ns (eth0) --veth-- pod ns (bridge) --veth-- [root ns: d<id>p<i>h] limiter [d<id>p<i>u] --veth-- router ns

The limiter's two interfaces stay in the root namespace, where its process (embedded target or
simple_switch_grpc) opens raw sockets on them and serves P4Runtime on loopback. Every name this
module creates is recorded, and `teardown` removes exactly those, also after errors.

With node placement each host (index k) has a limiter of its own, and beside it the DPU's crypto engine
(sealing.py; on BlueField it sits between the flow pipeline and the port), in a namespace of its own:

    host ns (eth0) --veth-- [root ns: port 0 d<id>n<k>h] limiter [port 1 d<id>n<k>u] --veth-- (clear) engine ns
                                                         [port 2 d<id>n<k>s] --veth-- (seal)  engine ns
    engine ns (wire) --veth-- pod ns (bridge port d<id>n<k>wx)

The limiter sends intra-pod frames out of its seal port; the engine seals them under the pod's key and puts
them on the wire. What arrives on the wire and opens under the key enters the limiter on its seal port,
everything else on its uplink port (metered). Each pod has one random key, made when the network is built
and kept in memory only (it reaches each engine on its stdin). The engines are started with the network and
stopped (SIGTERM to the recorded process, then kill) before its links are removed.

A sealed frame is sealing.OVERHEAD bytes longer than the clear one, so every link a sealed frame may cross
has an MTU of WIRE_MTU: engine to bridge, the node pods' bridge ports and their links to the router, the
router's ports, and each limiter's uplink port with its peer (an engine passes a sealed frame it cannot
open, one relayed out of another pod, to its limiter's uplink port, to be metered; a pod-uplink limiter
gets such frames from the router). Hosts' eth0 and the limiters' host and seal ports keep 1500: they
carry clear frames only (a sealed frame a limiter sends toward its host does not fit and is dropped
there, as the host would drop its EtherType anyway).

Besides routing IPv4, the network switches frames addressed to a host's MAC (frames.host_mac, which
every host's eth0 gets), as the virtual-time simulator does: each pod's bridge knows every host's MAC
(its own hosts on their ports, all others behind its uplink), and the router sends a frame addressed
to a host of pod P out of P's port unchanged (tc, before its IP stack could drop or rewrite it). So
evasion frames (evasion.py) that no router would route, VLAN-tagged, IPv6, with a forged source,
reach their receiver through both pods' limiters exactly as they were sent.

A topology's `switch_relays` make a pod's bridge betray its node DPUs' exemption (relay.py): frames its
hosts send to one host's MAC leave by the bridge's router-facing port, addressed to a host of another pod.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Topology
from .frames import host_mac
from .processes import stop_processes

LOG = logging.getLogger(__name__)

WIRE_MTU = 1600  # links that may carry sealed frames: 1500 + sealing.OVERHEAD (32) and room to spare
SEAL_PORT = 2  # a node limiter's port to its crypto engine
SEAL_KEY_BYTES = 16  # GCM-AES-128 (sealing.KEY_BYTES)
ENGINE_READY_S = 20.0  # how long an engine may take to open its sockets
MGMT_TABLE = 100  # the router's routing table for its management link alone
ENGINE_STOP_S = 10.0  # how long an engine may take to write its stats after SIGTERM


class NetError(RuntimeError):
    """A network setup command failed; the message has the command and its error."""


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS` (inside `ns` when given)."""
    cmd = ["ip", "-n", ns, *args] if ns else ["ip", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res


def in_ns(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command inside a namespace."""
    full = ["ip", "netns", "exec", ns, *cmd]
    res = subprocess.run(full, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(full)}: {res.stderr.strip()}")
    return res


def batch(ns: str, tool: str, lines: list[str]) -> None:
    """Run many `tool` (tc, bridge) commands inside `ns` in one process (`tool -batch -`)."""
    full = ["ip", "netns", "exec", ns, tool, "-batch", "-"]
    res = subprocess.run(full, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        raise NetError(f"{' '.join(full)}: {res.stderr.strip()}")


_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def entered(ns: str) -> Iterator[None]:
    """Run the body inside namespace `ns`, this thread only (sockets made there stay in `ns`)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
    finally:
        os.close(own)


def mac_text(mac: bytes) -> str:
    """A MAC address as ip and bridge write it."""
    return ":".join(f"{b:02x}" for b in mac)


def check_prerequisites() -> None:
    """Root and iproute2 are needed to build namespaces."""
    if os.geteuid() != 0:
        raise NetError("the lab builds network namespaces and needs root (run it as root)")
    for tool in ("ip", "tc", "bridge"):
        if shutil.which(tool) is None:
            raise NetError(f"the lab needs the '{tool}' command (Debian package iproute2)")


@dataclass
class LimiterPorts:
    """The root-namespace interfaces of one limiter: host-facing port 0, uplink port 1, and for a node
    limiter seal port 2 (to its crypto engine)."""

    name: str
    pod: str
    host_if: str
    uplink_if: str
    role: str = "pod-uplink"  # or "node": one limiter per host, between the host and its pod's switch
    seal_if: str = ""  # node limiters: the port to the crypto engine ("" for none)

    def interfaces(self) -> dict[int, str]:
        """The target's port map: {0: host side, 1: uplink, 2: seal port (node limiters)}."""
        ports = {0: self.host_if, 1: self.uplink_if}
        if self.seal_if:
            ports[SEAL_PORT] = self.seal_if
        return ports


@dataclass
class SealEngine:
    """One node DPU's crypto engine process (python -m dpu_lab.sealing) and where it reports."""

    host: str
    ns: str
    popen: subprocess.Popen[bytes]
    stats: Path
    log: Path

    @property
    def pid(self) -> int:
        """The engine's process id (ip netns exec runs the engine in its own process)."""
        return self.popen.pid


@dataclass
class LabNetwork:
    """The built network: namespaces per host, per pod and for the router, and each limiter's ports."""

    topology: Topology
    run_id: str = field(default_factory=lambda: secrets.token_hex(2))
    namespaces: list[str] = field(default_factory=list)
    root_links: list[str] = field(default_factory=list)
    host_ns: dict[str, str] = field(default_factory=dict)
    limiters: list[LimiterPorts] = field(default_factory=list)
    router_ns: str = ""
    router_ports: dict[str, str] = field(default_factory=dict)  # pod -> its port's name in the router namespace
    # Each pod's bridge ports: its hosts' ({host: port}) and its uplink's, for the bridges' static MACs.
    bridge_ports: dict[str, tuple[dict[str, str], str]] = field(default_factory=dict)
    pod_ns: dict[str, str] = field(default_factory=dict)  # pod -> its namespace (its switch's)
    # Scale-up link k -> the lab's namespace between its two hosts (ends "enda", "endb"), where it is counted.
    scaleup_wires: dict[int, str] = field(default_factory=dict)
    # Where the crypto engines write their logs and stats (seal-HOST.log, seal-HOST.json); None: a
    # temporary folder, removed at teardown.
    seal_dir: Path | None = None
    engine_ns: dict[str, str] = field(default_factory=dict)  # node host -> its DPU's engine namespace
    engines: list[SealEngine] = field(default_factory=list)
    # One random key per pod with node placement, in memory only (repr=False: never printed or logged).
    seal_keys: dict[str, bytes] = field(default_factory=dict, repr=False)
    _tmp_seal_dir: Path | None = field(default=None, repr=False)

    @property
    def prefix(self) -> str:
        """Prefix of every name this run creates."""
        return f"dl{self.run_id}"

    def mac_of(self, host: str, port: int = 0) -> bytes:
        """The MAC of a host's eth0 (the simulator's, frames.host_mac); with `port`, a flow's source MAC."""
        topo = self.topology
        pod = topo.pod_of_host(host)
        return host_mac(topo.pods.index(pod), pod.hosts.index(host) + 1, port)

    def _netns(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("link", "set", "lo", "up", ns=name)
        _quiet_ipv6(name)
        return name

    def _veth(self, a: str, b: str, mtu: int | None = None) -> None:
        size = ["mtu", str(mtu)] if mtu else []
        ip("link", "add", a, *size, "type", "veth", "peer", "name", b, *size)
        self.root_links.append(a)

    def build(self) -> None:
        """Create everything; on failure, remove what was made and re-raise."""
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise

    def _build(self) -> None:
        p = self.prefix
        router = self.router_ns = self._netns("r")
        in_ns(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        hosts_seen = 0
        for i, pod in enumerate(self.topology.pods):
            pod_ns = self._netns(f"p{i}")
            self.pod_ns[pod.name] = pod_ns
            ip("link", "add", "br0", "type", "bridge", ns=pod_ns)
            ip("link", "set", "br0", "up", ns=pod_ns)
            # A switch forwards frames as they are: with br_netfilter loaded, the bridge would check and
            # drop malformed IPv4 before it reached a DPU (the red team's lying headers).
            in_ns(pod_ns, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0", check=False)
            plen = ipaddress.IPv4Network(pod.subnet).prefixlen
            gateway = (router, f"{pod.gateway}/{plen}")
            on_bridge: dict[str, str] = {}
            for j, host in enumerate(pod.hosts):
                k = hosts_seen
                hosts_seen += 1
                hns = self._netns(f"h{k}")
                self.host_ns[host] = hns
                if pod.placement == "node":
                    # host eth0 -- [limiter of this node] -- clear / seal -- [crypto engine] -- wire -- pod bridge
                    self.seal_keys.setdefault(pod.name, secrets.token_bytes(SEAL_KEY_BYTES))
                    host_if = self._pair(f"{p}n{k}h", (hns, None), rename="eth0")
                    ens = self.engine_ns[host] = self._netns(f"e{k}")
                    # Frames the engine cannot open leave it on `clear` as they came, sealed ones included.
                    up_if = self._pair(f"{p}n{k}u", (ens, None), rename="clear", mtu=WIRE_MTU)
                    seal_if = self._pair(f"{p}n{k}s", (ens, None), rename="seal")
                    wire = self._pair(f"{p}n{k}w", (pod_ns, "br0"), root_end_to=(ens, "wire"), mtu=WIRE_MTU)
                    ip("link", "set", wire, "up", ns=ens)
                    _offloads_off(ens, ["clear", "seal", wire])
                    self._limiter(f"dpu-{host}", pod.name, "node", host_if, up_if, seal_if)
                    on_bridge[host] = f"{p}n{k}wx"
                else:
                    self._pair(f"{p}h{k}", (pod_ns, "br0"), root_end_to=(hns, "eth0"))
                    on_bridge[host] = f"{p}h{k}x"
                ip("link", "set", "eth0", "address", mac_text(self.mac_of(host)), ns=hns)
                ip("addr", "add", f"{pod.host_address(j)}/{plen}", "dev", "eth0", ns=hns)
                ip("link", "set", "eth0", "up", ns=hns)
                ip("route", "add", "default", "via", pod.gateway, ns=hns)
                _offloads_off(hns, ["eth0"])
            if pod.placement == "node":
                # pod bridge -- router: no limiter on the uplink, the nodes' DPUs do the limiting
                self._pair(f"{p}p{i}r", (router, None), root_end_to=(pod_ns, "br0"), address=gateway, mtu=WIRE_MTU)
                self.router_ports[pod.name] = f"{p}p{i}rx"  # _pair's name for the peer end
                self.bridge_ports[pod_ns] = (on_bridge, f"{p}p{i}r")
            else:
                host_if = self._pair(f"{p}p{i}h", (pod_ns, "br0"))
                # Sealed frames relayed out of a node pod may arrive here: they reach the limiter, to be metered.
                up_if = self._pair(f"{p}p{i}u", (router, None), address=gateway, mtu=WIRE_MTU)
                self.router_ports[pod.name] = f"{up_if}x"
                self._limiter(f"dpu-{pod.name}", pod.name, "pod-uplink", host_if, up_if)
                self.bridge_ports[pod_ns] = (on_bridge, f"{host_if}x")
        for k, link in enumerate(self.topology.scaleup_links):
            self._scaleup(k, link.a, link.b)
        self._switch_by_mac()
        self._relays()
        self._start_engines()

    def add_management(self) -> tuple[str, str]:
        """A management link between the root namespace (where the verifier runs) and the router, as a site's
        out-of-band network: (the root end's address, the router's). Link-local /32s picked per run; the
        router answers on it only from its management address (a policy route), so pods' traffic, which
        the router forwards, has no route onto it."""
        taken = ip("-4", "-o", "addr", "show").stdout
        seed = int(self.run_id, 16)
        for k in range(64):
            block = (seed + k * 977) % (254 * 64)
            base = f"169.254.{block // 64 + 1}.{block % 64 * 4}"
            root_ip, router_ip = _plus(base, 1), _plus(base, 2)
            if f" {root_ip}/" not in taken and f" {router_ip}/" not in taken:
                break
        else:
            raise RuntimeError("no free link-local address for the router's management link")
        root_if = self._pair(f"{self.prefix}mg", (self.router_ns, None), rename="mgmt")
        ip("addr", "add", f"{root_ip}/32", "dev", root_if)
        ip("route", "add", f"{router_ip}/32", "dev", root_if)
        ip("addr", "add", f"{router_ip}/32", "dev", "mgmt", ns=self.router_ns)
        ip("route", "add", f"{root_ip}/32", "dev", "mgmt", "table", str(MGMT_TABLE), ns=self.router_ns)
        ip("rule", "add", "from", router_ip, "lookup", str(MGMT_TABLE), ns=self.router_ns)
        return root_ip, router_ip

    def _switch_by_mac(self) -> None:
        """Static MACs in every pod's bridge, and the router's switching of frames addressed to hosts."""
        macs = {h: mac_text(m) for h, m in self.topology.host_macs().items()}
        for pod_ns, (on_bridge, uplink) in self.bridge_ports.items():
            # Static entries: a frame for a host no one has heard from yet is not flooded to every port.
            # Sticky: a frame from elsewhere with a host's MAC as its source cannot move the host's
            # entry (a pod switch's port security), or exempt frames to it would leave the pod.
            batch(
                pod_ns,
                "bridge",
                [f"fdb add {m} dev {on_bridge.get(h, uplink)} master static sticky" for h, m in macs.items()],
            )
        # One shared filter block on every pod port: a frame whose destination MAC is 02:PP:... (a host of
        # pod PP) leaves by PP's port as it came; any other frame (IPv4 to the router's MAC, ARP) is routed.
        lines = [f"qdisc add dev {port} ingress_block 1 clsact" for port in self.router_ports.values()]
        for i, pod in enumerate(self.topology.pods):
            lines.append(
                f"filter add block 1 protocol all prio 1 u32 match u16 0x02{i:02x} 0xffff at -14 "
                f"action mirred egress redirect dev {self.router_ports[pod.name]}"
            )
        batch(self.router_ns, "tc", lines)

    def _relays(self) -> None:
        """Pod switches that relay frames out of their pod (Topology.switch_relays; relay.py): on each of the
        pod's host ports but the addressee's, frames to its MAC leave by the bridge's router-facing port."""
        for relay in self.topology.switch_relays:
            pod_ns = self.pod_ns[self.topology.pod_of_host(relay.addressed_to).name]
            on_bridge, uplink = self.bridge_ports[pod_ns]
            ports = [port for host, port in on_bridge.items() if host != relay.addressed_to]
            match, new = mac_text(self.mac_of(relay.addressed_to)), mac_text(self.mac_of(relay.to))
            cmd = [sys.executable, "-m", "dpu_lab.relay", "--match", match, "--set", new, "--out", uplink, *ports]
            res = subprocess.run(["ip", "netns", "exec", pod_ns, *cmd], capture_output=True, text=True)
            if res.returncode != 0:
                raise NetError(
                    f"installing the relay of {relay.addressed_to}'s frames in {pod_ns}: {res.stderr.strip()}"
                )

    def _scaleup(self, k: int, a: str, b: str) -> None:
        """An NVSwitch-style path between two hosts, `nvsK` at both, with /32 routes over it, through a
        namespace of the lab's own (`scaleup_wires[k]`, ends `enda` and `endb`) where tc moves every frame from one
        end to the other as it is: the boundary capture counts there, on interfaces no host holds (a host
        can send past its own taps with PACKET_QDISC_BYPASS, and take frames off its interface before the
        kernel's taps with XDP)."""
        ns_a, ns_b = self.host_ns[a], self.host_ns[b]
        iface = f"nvs{k}"
        wire = self.scaleup_wires[k] = self._netns(f"w{k}")
        for end, ns in (("a", ns_a), ("b", ns_b)):
            self._pair(f"{self.prefix}s{k}{end}", (wire, None), rename=f"end{end}", root_end_to=(ns, iface))
            ip("link", "set", iface, "up", ns=ns)
            _offloads_off(ns, [iface])
        _offloads_off(wire, ["enda", "endb"])
        # u32 matching nothing in particular: every frame, whatever its EtherType (a bridge would keep some).
        batch(
            wire,
            "tc",
            [f"qdisc add dev {end} clsact" for end in ("enda", "endb")]
            + [
                f"filter add dev {end} ingress protocol all prio 1 u32 match u32 0 0 action mirred egress "
                f"redirect dev {other}"
                for end, other in (("enda", "endb"), ("endb", "enda"))
            ],
        )
        ip("route", "add", f"{self.topology.address_of(b)}/32", "dev", iface, ns=ns_a)
        ip("route", "add", f"{self.topology.address_of(a)}/32", "dev", iface, ns=ns_b)

    def _pair(
        self,
        root_name: str,
        peer: tuple[str, str | None],
        rename: str | None = None,
        root_end_to: tuple[str, str] | None = None,
        address: tuple[str, str] | None = None,
        mtu: int | None = None,
    ) -> str:
        """A veth pair: one end stays in the root namespace (or moves to `root_end_to` = (ns, bridge or
        new name)), the peer goes to `peer` = (ns, bridge to join or None); `rename` names the peer
        inside its namespace; `address` = (ns, CIDR) puts an address on the peer; `mtu` is both ends'
        (default 1500). Returns the root end (its new name when moved)."""
        peer_ns, bridge = peer
        peer_name = f"{root_name}x"
        self._veth(root_name, peer_name, mtu)
        ip("link", "set", peer_name, "netns", peer_ns)
        if rename:
            ip("link", "set", peer_name, "name", rename, ns=peer_ns)
            peer_name = rename
        if bridge:
            ip("link", "set", peer_name, "master", bridge, ns=peer_ns)
        if address:
            ip("addr", "add", address[1], "dev", peer_name, ns=peer_ns)
        ip("link", "set", peer_name, "up", ns=peer_ns)
        if rename is None:
            _offloads_off(peer_ns, [peer_name])
        if root_end_to is not None:
            ns, target = root_end_to
            ip("link", "set", root_name, "netns", ns)
            self.root_links.remove(root_name)
            if target == "br0":
                ip("link", "set", root_name, "master", "br0", ns=ns)
                ip("link", "set", root_name, "up", ns=ns)
                _offloads_off(ns, [root_name])
            else:
                ip("link", "set", root_name, "name", target, ns=ns)
            return target
        _sysctl_root(f"net/ipv6/conf/{root_name}/disable_ipv6", "1")
        ip("link", "set", root_name, "up")
        _offloads_off(None, [root_name])
        return root_name

    def _limiter(self, name: str, pod: str, role: str, host_if: str, up_if: str, seal_if: str = "") -> None:
        self.limiters.append(
            LimiterPorts(name=name, pod=pod, host_if=host_if, uplink_if=up_if, role=role, seal_if=seal_if)
        )

    # ------------------------------------------------------------------ the crypto engines

    def _seal_dir(self) -> Path:
        if self.seal_dir is not None:
            self.seal_dir.mkdir(parents=True, exist_ok=True)
            return self.seal_dir
        if self._tmp_seal_dir is None:
            self._tmp_seal_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-seal-"))
        return self._tmp_seal_dir

    def _start_engines(self) -> None:
        """One crypto engine per node DPU, in its engine namespace, its pod's key on its stdin; returns once
        every engine has its sockets open."""
        topo = self.topology
        where = self._seal_dir()
        for host, ns in self.engine_ns.items():
            key = self.seal_keys[topo.pod_of_host(host).name]
            stats, log = where / f"seal-{host}.json", where / f"seal-{host}.log"
            stats.unlink(missing_ok=True)
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "dpu_lab.sealing"]
            cmd += ["--clear", "clear", "--seal", "seal", "--wire", "wire", "--mac", mac_text(self.mac_of(host))]
            cmd += ["--stats", str(stats)]
            with log.open("wb") as out:
                popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
            self.engines.append(SealEngine(host, ns, popen, stats, log))
            assert popen.stdin is not None
            try:
                popen.stdin.write(key.hex().encode() + b"\n")  # never on the command line (ps shows it)
                popen.stdin.close()
            except BrokenPipeError:
                pass  # it exited at once: reported below, with its log
        deadline = time.monotonic() + ENGINE_READY_S
        for eng in self.engines:
            while b"ready" not in eng.log.read_bytes():
                if eng.popen.poll() is not None:
                    raise NetError(
                        f"the crypto engine of {eng.host} exited with {eng.popen.returncode}: "
                        f"{eng.log.read_text(errors='replace').strip()[-500:]}"
                    )
                if time.monotonic() > deadline:
                    raise NetError(f"the crypto engine of {eng.host} opened no sockets within {ENGINE_READY_S:g} s")
                time.sleep(0.05)

    def stop_engines(self) -> dict[str, dict[str, Any]]:
        """Stop every crypto engine (SIGTERM to its recorded process, kill if it lingers) and return the stats
        each wrote, by host. Safe to call again: engines already stopped are not signalled twice."""
        killed = stop_processes(*(eng.popen for eng in self.engines), timeout=ENGINE_STOP_S)
        stats: dict[str, dict[str, Any]] = {}
        for eng in self.engines:
            if eng.popen in killed:
                LOG.warning("crypto engine of %s (pid %d) ignored SIGTERM; killed it", eng.host, eng.pid)
            try:
                stats[eng.host] = json.loads(eng.stats.read_text())
            except (OSError, ValueError):
                pass
        return stats

    def teardown(self) -> None:
        """Stop the crypto engines, then remove every namespace and root-namespace link this run created."""
        self.stop_engines()
        self.engines.clear()
        for link in self.root_links:
            ip("link", "del", link, check=False)
        self.root_links.clear()
        for ns in reversed(self.namespaces):
            res = ip("netns", "del", ns, check=False)
            if res.returncode != 0 and "No such file" not in res.stderr:
                LOG.warning("could not remove namespace %s: %s", ns, res.stderr.strip())
        self.namespaces.clear()
        self.engine_ns.clear()
        self.seal_keys.clear()  # the keys lived as long as the network
        if self._tmp_seal_dir is not None:
            shutil.rmtree(self._tmp_seal_dir, ignore_errors=True)
            self._tmp_seal_dir = None


def _plus(address: str, n: int) -> str:
    return str(ipaddress.IPv4Address(address) + n)


def _sysctl_root(key: str, value: str) -> None:
    with open(f"/proc/sys/{key}", "w") as f:
        f.write(value)


def _quiet_ipv6(ns: str) -> None:
    # No IPv6 autoconfiguration chatter: the limiter meters it (fail closed), but it would
    # muddy the lab's byte counts.
    in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=False)
    in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=False)


def _offloads_off(ns: str | None, ifnames: list[str]) -> None:
    """Turn off checksum and segmentation offloads, as bmv2 labs do with ethtool.

    A software switch reading frames from a raw socket would otherwise see unfinished checksums
    and 64 KB super-frames that it cannot send on.
    """
    cmd = [sys.executable, "-m", "dpu_lab.offload", *ifnames]
    if ns is None:
        res = subprocess.run(cmd, capture_output=True, text=True)
    else:
        res = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True)
    if res.returncode != 0:
        raise NetError(f"disabling offloads on {ifnames} in {ns or 'root namespace'}: {res.stderr.strip()}")
