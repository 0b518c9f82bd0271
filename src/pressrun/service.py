"""What every pressrun service process shares: waiting for the operator's stop signal.

A service installs its handlers *before* it says it is listening (`stop_signals`), so
a supervisor that sends SIGTERM as soon as it reads the "listening" line gets a clean
shutdown instead of Python's default (a SIGTERM kills the process outright, a SIGINT
raises KeyboardInterrupt in the middle of whatever runs)::

    with stop_signals() as stopped:
        await service.start()
        log.info("... listening on ...")
        await stopped.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_signals() -> Iterator[asyncio.Event]:
    """Handlers of SIGTERM and SIGINT that set the event yielded, installed on entry.

    The handlers are removed on the way out, so a second signal during a slow shutdown
    falls back to Python's default behaviour and ends the process.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
