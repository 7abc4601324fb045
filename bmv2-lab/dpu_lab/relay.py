"""`python -m dpu_lab.relay --match MAC --set MAC --out IFNAME IFNAME...`: a pod switch that relays frames
out of its pod (config.SwitchRelay), run inside the pod's namespace.

On each named bridge port, frames arriving whose Ethernet destination is exactly `--match` get it
rewritten to `--set` and leave by `--out` (the bridge's router-facing port) instead of being switched;
every other frame is switched as before. This is what `tc ... action pedit ex munge eth dst set MAC
pipe action mirred egress redirect dev OUT` would do, but the lab's kernel has neither act_pedit nor
cls_flower, so it is a small eBPF program (cls_bpf, direct action: bpf_skb_store_bytes, then
bpf_redirect), loaded with the bpf(2) system call and attached through pyroute2. The filter holds the
program; deleting the namespace removes the ports, their filters and with them the program, so nothing
outlives the lab network.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import sys
from collections.abc import Sequence

from pyroute2 import IPRoute

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PROG_TYPE_XDP = 6
# Helpers (include/uapi/linux/bpf.h) and what a direct-action program returns.
_SKB_STORE_BYTES, _SKB_LOAD_BYTES, _REDIRECT = 9, 26, 23
_TC_ACT_OK = 0
_INGRESS = "ffff:fff2"  # clsact's ingress hook


def _insn(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One eBPF instruction: opcode, registers (source in the high nibble), offset, immediate."""
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)


def _le(data: bytes) -> int:
    """`data` as the signed little-endian immediate that compares with a load of those bytes."""
    return int.from_bytes(data, "little", signed=len(data) == 4)


def program(match: bytes, new: bytes, out_ifindex: int) -> bytes:
    """The relay as eBPF instructions: a frame to `match` is rewritten to `new` and redirected out of
    `out_ifindex`; any other frame passes on (TC_ACT_OK)."""
    if len(match) != 6 or len(new) != 6:
        raise ValueError("MAC addresses are 6 bytes")
    mov_x, mov_k, add_k, call, exit_ = 0xBF, 0xB7, 0x07, 0x85, 0x95
    ldx_w, ldx_h, st_w, st_h = 0x61, 0x69, 0x62, 0x6A
    jne_k, jne32_k = 0x55, 0x56
    fp = 10
    body = [
        _insn(mov_x, 6, 1),  # r6 = skb (r1 is clobbered by calls)
        # bpf_skb_load_bytes(skb, 0, fp - 8, 6): the destination MAC onto the stack
        _insn(mov_k, 2),
        _insn(mov_x, 3, fp),
        _insn(add_k, 3, imm=-8),
        _insn(mov_k, 4, imm=6),
        _insn(call, imm=_SKB_LOAD_BYTES),
        None,  # 6: if r0 != 0 goto pass (a runt frame)
        _insn(ldx_w, 1, fp, -8),
        None,  # 8: if (u32) r1 != match[0:4] goto pass
        _insn(ldx_h, 1, fp, -4),
        None,  # 10: if r1 != match[4:6] goto pass
        # bpf_skb_store_bytes(skb, 0, fp - 16, 6, 0): the new destination
        _insn(st_w, fp, off=-16, imm=_le(new[:4])),
        _insn(st_h, fp, off=-12, imm=_le(new[4:])),
        _insn(mov_x, 1, 6),
        _insn(mov_k, 2),
        _insn(mov_x, 3, fp),
        _insn(add_k, 3, imm=-16),
        _insn(mov_k, 4, imm=6),
        _insn(mov_k, 5),
        _insn(call, imm=_SKB_STORE_BYTES),
        # return bpf_redirect(out, 0): TC_ACT_REDIRECT, out of the egress of `out`
        _insn(mov_k, 1, imm=out_ifindex),
        _insn(mov_k, 2),
        _insn(call, imm=_REDIRECT),
        _insn(exit_),
    ]
    passing = len(body)  # the instruction after the body
    body[6] = _insn(jne_k, 0, off=passing - 7, imm=0)
    body[8] = _insn(jne32_k, 1, off=passing - 9, imm=_le(match[:4]))
    body[10] = _insn(jne_k, 1, off=passing - 11, imm=_le(match[4:]))
    tail = [_insn(mov_k, 0, imm=_TC_ACT_OK), _insn(exit_)]
    return b"".join(i for i in body if i is not None) + b"".join(tail)


def load(insns: bytes, prog_type: int = _BPF_PROG_TYPE_SCHED_CLS, name: bytes = b"pod_switch_rly") -> int:
    """Load an eBPF program (sched_cls unless `prog_type` says otherwise); returns its file descriptor (the
    verifier's log in the error)."""
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise OSError(f"no bpf(2) system call number known for {os.uname().machine}")
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack(
        "<IIQQIIQII16s",
        prog_type,
        len(insns) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license_),
        1,  # log level: the verifier says why, if it refuses
        len(log),
        ctypes.addressof(log),
        0,
        0,
        name,
    )
    buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(nr, _BPF_PROG_LOAD, buf, len(buf)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"loading eBPF program {name!r}: {os.strerror(err)}: {log.value.decode()[-2000:]}")
    return fd


def install(match: bytes, new: bytes, out: str, ports: Sequence[str]) -> None:
    """Relay frames to `match` arriving on each of `ports` out of `out`, rewritten to `new` (this namespace)."""
    with IPRoute() as ipr:
        out_index = ipr.link_lookup(ifname=out)[0]
        fd = load(program(match, new, out_index))
        try:
            for port in ports:
                index = ipr.link_lookup(ifname=port)[0]
                ipr.tc("add", "clsact", index)
                ipr.tc(
                    "add-filter",
                    "bpf",
                    index,
                    ":1",
                    fd=fd,
                    name="pod-switch-relay",
                    parent=_INGRESS,
                    classid=1,
                    direct_action=True,
                )
        finally:
            os.close(fd)  # the filters hold the program now


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.relay", description=__doc__.splitlines()[0])
    parser.add_argument("--match", type=_mac, required=True, help="destination MAC of the frames to relay")
    parser.add_argument("--set", type=_mac, required=True, help="their destination MAC once relayed")
    parser.add_argument("--out", required=True, help="the port they leave by")
    parser.add_argument("ports", nargs="+", help="the ports whose arriving frames are relayed")
    args = parser.parse_args(argv)
    install(args.match, args.set, args.out, args.ports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
