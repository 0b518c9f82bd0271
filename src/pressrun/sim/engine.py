"""The event loop: a heap of (time, sequence, callback, args), virtual time only.

Events at the same time run in the order they were scheduled (the sequence number
breaks ties), so a run is a pure function of its scenario and master seed. The loop
owns `now`; nothing in the simulator reads a clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Callback = Callable[..., None]


class EventLoop:
    """A heapq event loop ordered by (time, sequence)."""

    __slots__ = ("_heap", "_seq", "_stopped", "events_processed", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callback, tuple[Any, ...]]] = []
        self._seq = 0
        self.now = 0.0
        self.events_processed = 0
        self._stopped = False

    def stop(self) -> None:
        """End `run` after the event being processed (the rest stays queued)."""
        self._stopped = True

    def at(self, time: float, callback: Callback, *args: Any) -> None:
        """Run `callback(*args)` at virtual `time` (never before now)."""
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, callback, args))

    def after(self, delay: float, callback: Callback, *args: Any) -> None:
        """Run `callback(*args)` `delay` seconds from now."""
        # `at(self.now + delay, ...)` inlined: most events are scheduled this way.
        now = self.now
        time = now + delay
        if time < now:
            time = now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, callback, args))

    def run(self, until: float) -> None:
        """Process events in order until the heap is empty or the next is after `until`."""
        heap = self._heap
        pop = heapq.heappop
        count = 0
        self._stopped = False
        while heap and heap[0][0] <= until:
            time, _, callback, args = pop(heap)
            self.now = time
            callback(*args)
            count += 1
            if self._stopped:
                self.events_processed += count
                return
        self.events_processed += count
        self.now = max(self.now, until)

    def pending(self) -> int:
        """Events still queued."""
        return len(self._heap)
