"""What every pressrun service process shares: waiting for the operator's stop signal."""

from __future__ import annotations

import asyncio
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def wait_for_stop_signal() -> None:
    """Return when the process gets SIGTERM or SIGINT (then the caller shuts down).

    The handlers are removed on the way out, so a second signal during a slow shutdown
    falls back to Python's default behaviour and ends the process.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
