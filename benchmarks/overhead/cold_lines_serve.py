"""`radixgate serve ARGV` with callgrind's instrumentation on from each generation request's first
bytes to its response's end, after 10 requests (`cold_lines.WARM_REQUESTS`). Started by
`benchmarks.overhead.cold_lines` as a script, so the checkout on PYTHONPATH provides `proxy`
(this file must not import `benchmarks`); `COLD_LINES_TOGGLES` is the library that switches."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from proxy import direct_cycle, server_protocol
from proxy.cli import main

WARM_REQUESTS = 10

toggles = ctypes.CDLL(os.environ["COLD_LINES_TOGGLES"])
seen = 0
receive = server_protocol.GatewayHttpProtocol.data_received
send = direct_cycle.DirectCycle.send


def data_received(self: Any, data: bytes) -> None:
    global seen
    if (self.cycle is None or self.cycle.response_complete) and data.startswith(b"POST /v1/"):
        seen += 1
        if seen > WARM_REQUESTS:
            toggles.cold_lines_start()
    receive(self, data)


async def counted_send(self: Any, message: Any) -> None:
    await send(self, message)
    if self.response_complete:
        toggles.cold_lines_stop()


server_protocol.GatewayHttpProtocol.data_received = data_received  # type: ignore[method-assign]
direct_cycle.DirectCycle.send = counted_send  # type: ignore[method-assign]
sys.exit(main(sys.argv[1:]))
