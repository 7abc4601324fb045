"""dpu-limiter: caps the bandwidth between accelerator pods by programming P4 data planes."""

import os as _os
import sys as _sys

# A client command's stderr holds its own messages: gRPC's C core logs there on its own (its poller thread
# printed an epoll error at exit ahead of a refused file's message, CI 2026-12-03). The core reads
# GRPC_VERBOSITY once, when grpc is first imported, which is after this package's own import; a value the
# user sets wins, and servers (`serve`, `verify`, the lab) keep the core's errors.
if _sys.argv[1:2] and _sys.argv[1] in {"apply", "delete", "get", "cap", "usage", "status"}:
    _os.environ.setdefault("GRPC_VERBOSITY", "NONE")
