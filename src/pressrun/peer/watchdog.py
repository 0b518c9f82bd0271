"""A bound on how long a command-line peer may take to end, that needs no GIL.

libtorrent's Python binding destroys a session holding the GIL, and the destructor
waits for each tracker connection to close; a WebSocket tracker that stops answering
mid-close (frozen, its network gone) would hold it for good, and with it the whole
process, signal handlers included (`pressrun.peer.session`, docs/tracker.md). A
Python timer cannot fire then; ``faulthandler``'s watchdog thread can: past the bound
it writes every thread's stack to stderr and ends the process with status 1.

Libraries leave the bound off (it ends the whole process); ``pressrun get`` and
``pressrun seed`` set it (`set_close_bound`) and, when a session of the process had a
WebSocket tracker (`note_webrtc`), arm it once more for the exit (`bounded_exit`:
libdatachannel's threads once held an interpreter exit after a session with WebRTC
peers, FIELD-NOTES.md). That covers the interpreter's finalization until faulthandler's
own teardown, which cancels the watchdog: a hang in native destructors after it is not
covered.

The watchdog's way out is status 1, so a download that had ended verified was once
counted failed: in the emulated flash crowd of 28 Nov (22:52, ed919de, desktops with
WebRTC sessions) six clients printed their verified result and then hung for 8 s at
interpreter exit, with no Python frame. The console script therefore ends such a
process itself once the command has returned (`end_process`: flush, then ``os._exit``
with the command's status), so the interpreter's teardown, where those native threads
hold it, never runs; `bounded_exit` still bounds the last output and the flush.

Since issue 29 a command-line peer never destroys a session at all: it keeps it, paused
(`note_kept`, `pressrun.peer.session.AlertSession.close`), and ends the same way. The
destructor held the GIL past the bound mid-download at load 112 (a desktop that left its
swarm for the carousel, 29 Nov at 8059ace), and the watchdog's status 1 cost a reader
its download; no destructor, no such hang, however loaded the host.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import math
import os
import sys
from collections.abc import Iterator

#: the bound the command-line peers use: a session closes in at most about 2.5 s
#: (``stop_tracker_timeout`` 2 s for HTTP trackers, the WebSocket grace 0.5 s)
COMMAND_LINE_BOUND_S = 8.0
#: overrides `COMMAND_LINE_BOUND_S` (seconds, > 0)
BOUND_ENV = "PRESSRUN_CLOSE_BOUND_S"

_bound_s: float | None = None
_webrtc = False
_kept = False


def set_close_bound(seconds: float | None) -> None:
    """Bound each session's destructor (and `bounded_exit`) to ``seconds``; None: off."""
    global _bound_s
    _bound_s = seconds


def command_line_bound() -> float:
    """The command-line peers' bound: ``$PRESSRUN_CLOSE_BOUND_S`` if set (a positive
    number), else `COMMAND_LINE_BOUND_S`; a bad value is a `ValueError`."""
    raw = os.environ.get(BOUND_ENV, "").strip()
    if not raw:
        return COMMAND_LINE_BOUND_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{BOUND_ENV} must be a positive number of seconds, not {raw!r}")
    return value


def close_bound() -> float | None:
    """The bound set by `set_close_bound` (None: off)."""
    return _bound_s


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Within the block, a hang past the bound ends the process (no-op when off)."""
    bound = _bound_s
    if bound is None:
        yield
        return
    faulthandler.dump_traceback_later(bound, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def note_webrtc() -> None:
    """A session of this process has a WebSocket tracker (WebRTC peers)."""
    global _webrtc
    _webrtc = True


def note_kept() -> None:
    """A session of this process was kept instead of destroyed (`process_ends_itself`):
    `end_process` ends the process then, so no destructor runs at its exit either."""
    global _kept
    _kept = True


def process_ends_itself() -> bool:
    """The command-line peer ends this process with `end_process` (the bound is set: only
    ``pressrun get``/``seed`` set it): a session it no longer uses is left to that end
    (`pressrun.peer.session.AlertSession.close`, `note_kept`) instead of being
    destroyed."""
    return _bound_s is not None


def _ends_by_exit() -> bool:
    return _webrtc or _kept


def bounded_exit() -> None:
    """Arm the watchdog for the interpreter's exit when the bound is set and a session
    had WebRTC peers or was kept (else a no-op): a normal exit ends the process first."""
    if _bound_s is not None and _ends_by_exit():
        faulthandler.dump_traceback_later(_bound_s, exit=True)


def end_process(code: int) -> None:
    """End the process now with ``code`` when a session of it had WebRTC peers or was
    kept (else return): logging and the standard streams are flushed, then ``os._exit``
    skips the interpreter's teardown, where libdatachannel's threads have held the exit
    and a kept session's destructor would run (module docstring). Only the console
    script calls it: a library or a test must go on."""
    if not _ends_by_exit():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
