"""Starting one P4 target process per limiter: the embedded target, or bmv2's simple_switch_grpc.

Both get the same command line shape (`--device-id`, `-i PORT@IF`, `--no-p4`, then after `--`
`--grpc-server-addr`), so the rest of the lab does not care which one runs.
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dpu_limiter.units import CPU_PORT, MAX_FRAME_BYTES
from dpu_softswitch.firmware import Firmware, FirmwareClient

from .bmv2_firmware import Bmv2Firmware
from .processes import stop_processes

TargetKind = Literal["embedded", "bmv2"]
BMV2_BINARY = "simple_switch_grpc"

# Most bytes each target holds after limiter.p4's meter, which runs in the ingress pipeline. bmv2's
# simple_switch queues up to 64 frames per egress port and 128 in its output buffer, plus one in
# each of its egress and transmit threads (targets/simple_switch/simple_switch.cpp); when those
# queues drain after a stall, a receiver sees them in less time than the meter took to pass them.
# The embedded target sends each frame before it reads the next, so it holds one at most: the frame
# between its meter and its send, which a pause of its thread (the GIL, the CPU) can hold back while
# the next ones follow on time.
BUFFER_BYTES: dict[TargetKind, int] = {"embedded": MAX_FRAME_BYTES, "bmv2": (64 + 128 + 2) * MAX_FRAME_BYTES}


class TargetError(RuntimeError):
    """A target could not be started."""


def free_port() -> int:
    """A TCP port on loopback that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def bmv2_has_thrift(path: str) -> bool:
    """Whether the simple_switch_grpc at `path` was built with the Thrift runtime API."""
    res = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    return "--thrift-port" in res.stdout + res.stderr


def bmv2_path() -> str:
    """Where simple_switch_grpc is, or a TargetError saying it is missing."""
    path = shutil.which(BMV2_BINARY)
    if path is None:
        raise TargetError(f"--target bmv2 needs {BMV2_BINARY} on PATH (not found); use --target embedded")
    return path


def bmv2_thrift_port(path: str, grpc_port: int) -> int | None:
    """A free port for the Thrift runtime API of the simple_switch_grpc at `path`, not its `grpc_port` (picked
    free the same way, not yet bound: the two were seen to be one); None if built without Thrift.

    A build with Thrift listens on 9090 unless told otherwise, so a second switch would fail to start.
    """
    if not bmv2_has_thrift(path):
        return None
    while (port := free_port()) == grpc_port:
        pass
    return port


def bmv2_options(thrift_port: int | None) -> list[str]:
    """Options every simple_switch_grpc we start gets: logging off, and its Thrift port when it has one."""
    return ["--log-level", "off", *(["--thrift-port", str(thrift_port)] if thrift_port is not None else [])]


def target_command(
    kind: TargetKind,
    device_id: int,
    interfaces: dict[int, str],
    grpc_addr: str,
    firmware: Path | None = None,
    thrift_port: int | None = None,
) -> list[str]:
    """The command line that starts a target of `kind`: the embedded one with its firmware socket, bmv2
    with its Thrift port."""
    ifs = [arg for port, ifname in sorted(interfaces.items()) for arg in ("-i", f"{port}@{ifname}")]
    if kind == "embedded":
        exe = [sys.executable, "-m", "dpu_softswitch.main", *(["--firmware-socket", str(firmware)] if firmware else [])]
        # The lab's links are Ethernet's: no frame longer than units.MAX_FRAME_BYTES, which every allowance and
        # buffer_bytes count on (a host's GSO frame would otherwise pass whole; tests/lab/test_redteam_wire.py).
        exe += ["--max-frame-bytes", str(MAX_FRAME_BYTES)]
    else:
        exe = [bmv2_path(), *bmv2_options(thrift_port)]
    # The limiter reads each DPU's clock through packet I/O on its CPU port (limiter.p4's clock echo).
    return [
        *exe,
        "--device-id",
        str(device_id),
        *ifs,
        "--no-p4",
        "--",
        "--grpc-server-addr",
        grpc_addr,
        "--cpu-port",
        str(CPU_PORT),
    ]


@dataclass
class TargetProcess:
    """A running target and where it listens."""

    name: str
    kind: TargetKind
    device_id: int
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    firmware: Path | None = None  # the embedded target's firmware socket (dpu_softswitch.firmware)
    thrift_port: int | None = None  # bmv2's Thrift runtime API, where built with it (bmv2_firmware.py)

    def management(self) -> Firmware:
        """The device's own management path beside P4Runtime, which compromised firmware would use."""
        if self.thrift_port is not None:
            return Bmv2Firmware(self.thrift_port, self.address, self.device_id)
        if self.firmware is None:
            raise TargetError(f"{self.name}: no management path (a simple_switch_grpc built without Thrift)")
        return FirmwareClient(self.firmware)

    def stop(self) -> None:
        """Terminate the process we started (by its handle), then kill it if it lingers."""
        stop_processes(self.process, timeout=5)
        if self.firmware is not None:
            shutil.rmtree(self.firmware.parent, ignore_errors=True)


def start_target(
    name: str,
    kind: TargetKind,
    device_id: int,
    interfaces: dict[int, str],
    log_dir: Path,
    timeout: float = 20.0,
    port: int | None = None,
) -> TargetProcess:
    """Start a target (on `port`, or a free one) and wait until its P4Runtime port accepts connections."""
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    # A Unix socket's path must stay short (108 bytes): not under the run's folder.
    firmware = Path(tempfile.mkdtemp(prefix="p4fw-")) / "socket" if kind == "embedded" else None
    thrift_port = bmv2_thrift_port(bmv2_path(), port) if kind == "bmv2" else None
    cmd = target_command(kind, device_id, interfaces, address, firmware, thrift_port)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    tp = TargetProcess(name, kind, device_id, address, proc, log_path, firmware, thrift_port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TargetError(f"{name}: {' '.join(cmd)} exited with {proc.returncode}; see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return tp
        except OSError:
            time.sleep(0.05)
    tp.stop()
    raise TargetError(f"{name}: P4Runtime did not come up on {address} within {timeout:.0f} s; see {log_path}")
