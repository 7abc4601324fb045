"""N embedded targets in one process, for the benchmarks (convergence, replica_failover, replica_scale).

python bench/targets_host.py N      # prints one JSON line: the targets' P4Runtime addresses
python bench/targets_host.py N --origins   # and a second: each target's clock origin (time.monotonic_ns())
python bench/targets_host.py N --count     # count the RPCs served by method; SIGUSR2 prints the counts (JSON, stderr)

Each server also answers an echo service (ECHO_SERVICE: Unary, and Stream with one reply) that
returns the bytes it is sent: convergence.py times gRPC alone with it.

SIGUSR1 (sent once the pipelines are installed) moves every object alive into the garbage
collector's permanent generation: N pipelines are millions of long-lived objects, and a full
collection over them stalls the process for seconds at a random moment.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, add_to_server

ECHO_SERVICE = "dpu_limiter.bench.Echo"


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


async def main(n: int, origins: bool = False, count: bool = False) -> None:
    """Serve N devices until SIGTERM (with `origins`, say where each one's clock starts: a caller on this host
    then reads their clocks from its own monotonic clock, as replica_failover.py checks leases)."""
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
    print(json.dumps(addresses), flush=True)
    if origins:
        print(json.dumps(starts), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, gc.freeze)
    loop.add_signal_handler(signal.SIGUSR2, calls.dump)
    await stop.wait()
    await asyncio.gather(*(server.stop(0) for server in servers))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), "--origins" in sys.argv[2:], "--count" in sys.argv[2:]))
