"""N embedded targets in one process, for the benchmarks (convergence, replica_failover, replica_scale).

python bench/targets_host.py N      # prints one JSON line: the targets' P4Runtime addresses
python bench/targets_host.py N --origins   # and a second: each target's clock origin (time.monotonic_ns())
python bench/targets_host.py N --count     # count the RPCs served by method; SIGUSR2 prints the counts (JSON, stderr)
python bench/targets_host.py N --processes K   # the N targets spread over K processes (this one and K - 1 children)

Each server also answers an echo service (ECHO_SERVICE: Unary, and Stream with one reply) that
returns the bytes it is sent: convergence.py times gRPC alone with it.

SIGUSR1 (sent once the pipelines are installed) moves every object alive into the garbage
collector's permanent generation: N pipelines are millions of long-lived objects, and a full
collection over them stalls the process for seconds at a random moment.

Memory (docs/embedded-target.md, "Memory"): a target costs about 40 KiB idle (its gRPC server) and about
450 KiB once a controller has set limiter.p4 on it and holds a connection (the parsed JSON, the P4Info and the
code objects are shared by the targets of a process; counters, registers and meter tokens are allocated when
first used): 10,000 took 4.3 GiB over two processes. A target takes about FDS_PER_TARGET file descriptors;
under a limit of 20,000 a process holds at most 5,000 or so: spread more with --processes.

With --processes K the targets are spread over K processes, so that K cores answer them: this one serves the
first share and starts K - 1 children (this script with --child) for the others, in order; the addresses and
origins are printed as with one process, in the same order. SIGTERM, SIGUSR1 and SIGUSR2 are passed on to the
children (SIGUSR2 still prints one line: the counts of every process, summed). CPU time and py-spy taken on
this process's pid see only its own share.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, add_to_server

ECHO_SERVICE = "dpu_limiter.bench.Echo"
# File descriptors a target takes once the benchmarks drive it: its listener, its holder's connection, a
# replica's backup stream and replica_failover.py's lease watcher's (each a socket of this process).
FDS_PER_TARGET = 4


async def _echo(request: bytes, context: object) -> bytes:
    return request


async def _echo_stream(request: bytes, context: object) -> AsyncIterator[bytes]:
    yield request


ECHO = grpc.method_handlers_generic_handler(
    ECHO_SERVICE,
    {"Unary": grpc.unary_unary_rpc_method_handler(_echo), "Stream": grpc.unary_stream_rpc_method_handler(_echo_stream)},
)


class Calls(grpc.aio.ServerInterceptor):
    """Counts the RPCs every server answers, by method (replica_failover.py --profile reads them)."""

    def __init__(self) -> None:
        self.calls = Counter[str]()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Count the call, then serve it."""
        self.calls[handler_call_details.method.rpartition("/")[2]] += 1  # type: ignore[attr-defined]
        return await continuation(handler_call_details)

    def dump(self) -> None:
        """Print the counts so far (one JSON line on stderr)."""
        print(json.dumps(self.calls), file=sys.stderr, flush=True)


async def serve(n: int, count: bool) -> tuple[list[grpc.aio.Server], list[str], list[int], Calls]:
    """Start N devices, each on a gRPC server of its own (the control plane reaches each DPU at its own
    address): the servers, their addresses and clock origins, and the RPC counts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if FDS_PER_TARGET * n > hard:
        print(
            f"targets_host: {n} targets in one process need about {FDS_PER_TARGET * n} file descriptors (a listener,"
            f" a holder's and a backup's connection and a lease watcher's each), over this process's limit of {hard}:"
            " spread them with --processes",
            file=sys.stderr,
            flush=True,
        )
    servers = []
    addresses = []
    starts = []
    calls = Calls()
    for _ in range(n):
        server = grpc.aio.server(interceptors=[calls] if count else None)
        device = Device(1, cpu_port=CPU_PORT)
        starts.append(time.monotonic_ns() - device.clock.now_us() * 1000)
        add_to_server(server, device)
        server.add_generic_rpc_handlers((ECHO,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    return servers, addresses, starts, calls


def shares(n: int, k: int) -> list[int]:
    """N targets over K processes, as evenly as may be, the larger shares first."""
    return [n // k + (i < n % k) for i in range(k)]


async def child(n: int, count: bool) -> None:
    """One of the K - 1 children of --processes: its addresses and origins on stdout, then a line of counts
    (JSON) on stdout at each SIGUSR2, for the parent to sum."""
    if sys.platform == "linux":  # the parent killed (SIGKILL included): stop too (PR_SET_PDEATHSIG)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
        if os.getppid() == 1:
            return
    servers, addresses, starts, calls = await serve(n, count)
    print(json.dumps(addresses), flush=True)
    print(json.dumps(starts), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, gc.freeze)
    loop.add_signal_handler(signal.SIGUSR2, lambda: print(json.dumps(calls.calls), flush=True))
    await stop.wait()
    await asyncio.gather(*(server.stop(0) for server in servers))


async def main(n: int, origins: bool = False, count: bool = False, processes: int = 1) -> None:
    """Serve N devices until SIGTERM (with `origins`, say where each one's clock starts: a caller on this host
    then reads their clocks from its own monotonic clock, as replica_failover.py checks leases); with
    `processes` > 1, over that many processes."""
    own, *others = shares(n, max(1, min(processes, n)) if n else 1)
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            str(k),
            "--child",
            *(["--count"] if count else []),
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 26,  # a line of addresses: about 20 bytes a target
        )
        for k in others
    ]
    servers, addresses, starts, calls = await serve(own, count)
    for proc in children:  # they started theirs meanwhile
        assert proc.stdout is not None
        addresses += json.loads(await proc.stdout.readline())
        starts += json.loads(await proc.stdout.readline())
    print(json.dumps(addresses), flush=True)
    if origins:
        print(json.dumps(starts), flush=True)

    def tell(signum: int) -> None:
        for proc in children:
            if proc.returncode is None:
                proc.send_signal(signum)

    def freeze() -> None:
        tell(signal.SIGUSR1)
        gc.freeze()

    one_dump = asyncio.Lock()  # the children's answers are read in turn, a signal at a time

    async def dump() -> None:
        async with one_dump:
            tell(signal.SIGUSR2)
            total = Counter(calls.calls)
            for proc in children:
                assert proc.stdout is not None
                total.update(json.loads(await proc.stdout.readline()))
            print(json.dumps(total), file=sys.stderr, flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, freeze)
    if children:
        dumps: set[asyncio.Task[None]] = set()

        def on_usr2() -> None:
            task = loop.create_task(dump())
            dumps.add(task)
            task.add_done_callback(dumps.discard)

        loop.add_signal_handler(signal.SIGUSR2, on_usr2)
    else:
        loop.add_signal_handler(signal.SIGUSR2, calls.dump)
    await stop.wait()
    tell(signal.SIGTERM)
    await asyncio.gather(*(server.stop(0) for server in servers), *(proc.wait() for proc in children))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", type=int, help="how many targets")
    parser.add_argument("--origins", action="store_true", help="print each target's clock origin too")
    parser.add_argument("--count", action="store_true", help="count the RPCs served, by method (SIGUSR2 prints them)")
    parser.add_argument("--processes", type=int, default=1, metavar="K", help="spread the targets over K processes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.n, args.count))
    else:
        asyncio.run(main(args.n, args.origins, args.count, args.processes))
