"""Whether a swarm client leaves the swarm for the issue's carousel: the two times
for the rest of the file, from rates this client measured.

A client the balancer sent to the swarm watches the control channel
(:mod:`.carousel_watch`); when the issue's carousel is on the air it compares, at
every swarm progress report, how long each would take to bring what is missing, and
leaves when the carousel is sooner:

- **the swarm**: the bytes still wanted over the rate the swarm's *peers* delivered
  over the last ``window_s`` of its reports (bytes from the origins' web seeds are
  left out: the balancer starts a carousel at peak demand to spare the origins, so
  the swarm's time is what its peers alone would take; a swarm fed by the web seeds
  is left). The seconds since the last report are not counted: the peer reports on
  its own timer whatever arrives, so a late report is this client's process not
  running, not the swarm slowing (`SwarmRates.peer_bytes_per_s`). A swarm that has
  brought nothing from peers within the window never beats a carousel already on
  the air (the origins' fallback, below, may).
- **the carousel**: the whole object at the rate this client's link can be expected
  to take from it, plus the layering's climb to that many channels from the whole
  channels the link has shown (where the receiver starts). The object is
  counted whole whatever the client holds: the carousel feeds the decoder the pieces
  held, but a block completes only with its own symbols and a swarm's pieces are
  spread over the blocks, so the block held least (near none) sets the time
  (flash-crowd-50 at 2181bec, 28 Nov: readers that left with 41-47% of the file took
  as many packets as readers with nothing). The channels counted are those the
  link carries at their planned rates (the layering joins only on windows at the
  planned rate), by the best rate this client's link has shown (the swarm's peers
  and web seeds together over a window: the only measure of the link a client has
  before joining), one at least (a receiver holds one whatever its link); each
  brings what the sender's announcements show it sending (their packets-sent
  counters; a sender short of CPU sends under its plan), and all of them together
  at most what the link has shown. A fast link in a slow swarm is underrated, so
  such a client stays where it is no slower than it has been.
- **the origins**, while the swarm's peers bring nothing: a swarm with no progress
  for its ``stall_after_s`` ends and the rest comes from origin sections ("stalled,
  the rest from origins"), so the rest takes what is left of that wait plus the rest
  at the best rate the origins' web seeds delivered to this client over a window.
  The client leaves only when the carousel is sooner than that too: a client holding
  most of the file takes the few missing pieces (only their bytes) from the origins
  rather than the whole object from the carousel. Not counted (infinite) when the
  origins never delivered over a window or the stall rule is not known.

Measured in flash-crowd-50 at 2181bec (docs/results/2026-11-28-emulation-multicast-
twin.md): the lossy-10 clients that left with 41-47% of the file had been taking
8.8 Mbit/s from peers and took 50-52 s on the carousel; the swarm had their other
27 MB in about 25 s. The rule before (leave below half of the file, a constant that
assumed a carousel about twice the swarm's rate) sent them; the carousel-to-swarm
rate ratio measured for them was 0.8-1.7.

Pure: `SwarmRates` takes ``now`` with each report and reads no clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.events import CarouselPlan
from pressrun.multicast.layering import channels_within, climb_s

__all__ = ["CarouselChoice", "SenderRates", "SwarmRates", "carousel_choice"]

#: samples kept at most (reports come every 0.5 s; a window of 4 s needs 9)
MAX_SAMPLES = 64


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    peer_bytes: int
    all_bytes: int


@dataclass(slots=True)
class SwarmRates:
    """The swarm's rates as its progress reports show them (a bounded window).

    window_s: rates are measured over the last this many seconds (or since the swarm
        started, when that is shorter). 4 s: eight of the peer's status reports.
    min_span_s: the link's best rate counts only windows at least this long (a
        report's burst is not the link). 1 s.
    """

    started_at: float
    window_s: float = 4.0
    min_span_s: float = 1.0
    done_bytes: int = 0
    wanted_bytes: int = 0
    #: the swarm fetch is still downloading (not checking its copy, seeding or gone)
    downloading: bool = True
    #: the best rate (bytes/s) peers and web seeds together delivered over a window
    best_link_bytes_per_s: float = 0.0
    #: the swarm's stall rule: no progress for this long, the rest from origins (None:
    #: not known, the origins' time is not counted)
    stall_after_s: float | None = None
    #: the best rate (bytes/s) the origins' web seeds delivered over a window
    best_web_seed_bytes_per_s: float = 0.0
    #: when the done or downloaded bytes last grew (the stall rule's clock)
    last_progress_at: float = field(default=-math.inf)
    _samples: deque[_Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and 0 <= self.min_span_s <= self.window_s):
            raise ValueError("need window_s > 0 and 0 <= min_span_s <= window_s")
        self._samples.append(_Sample(self.started_at, 0, 0))
        self.last_progress_at = self.started_at

    def handle_progress(
        self,
        *,
        done_bytes: int,
        wanted_bytes: int,
        downloaded_bytes: int,
        web_seed_bytes: int,
        now: float,
        downloading: bool = True,
    ) -> None:
        """A swarm progress report at ``now``: the bytes done and wanted, the payload
        downloaded in all and from the web seeds (the rest from peers), and whether
        the fetch is still downloading (a fetch that has the file and seeds is never
        left: its peers bring nothing because nothing is missing)."""
        self.downloading = downloading
        all_bytes = max(0, downloaded_bytes)
        if max(0, done_bytes) > self.done_bytes or all_bytes > self._samples[-1].all_bytes:
            self.last_progress_at = now
        self.done_bytes = max(0, done_bytes)
        self.wanted_bytes = max(0, wanted_bytes)
        sample = _Sample(now, max(0, all_bytes - max(0, web_seed_bytes)), all_bytes)
        self._samples.append(sample)
        self._forget(now)
        first = self._samples[0]
        span = now - first.at
        if span >= self.min_span_s:
            rate = (all_bytes - first.all_bytes) / span
            self.best_link_bytes_per_s = max(self.best_link_bytes_per_s, rate)
            web = (all_bytes - sample.peer_bytes) - (first.all_bytes - first.peer_bytes)
            self.best_web_seed_bytes_per_s = max(self.best_web_seed_bytes_per_s, web / span)

    def _forget(self, now: float) -> None:
        # keep one sample at or before the window's start, so the window is spanned
        while len(self._samples) > 1 and self._samples[1].at <= now - self.window_s:
            self._samples.popleft()

    def peer_bytes_per_s(self) -> float:
        """Bytes/s the peers delivered over the window ending at the last report.

        The time since the last report does not count: the peer reads its status on
        its own timer (every ``status_interval_s``) whether or not anything arrived,
        so peers that stop show as reports with nothing new, and a report that is late
        means this client's own process did not run. In the emulated 150-client flash
        crowd at e982b92 (29 Nov 01:25, load 39-96) 17 of 54 swarm clients had 3-10 s
        between two of their once-a-second progress lines; counting such seconds as
        nothing delivered read a mobile-6 client taking 0.7 MB/s from its peers, 88%
        held, as 109 s from the rest (its reports either side: about 8 s). It left,
        and the carousel took 65 s more."""
        last = self._samples[-1]
        self._forget(last.at)
        first = self._samples[0]
        span = last.at - first.at
        if span <= 0:
            return 0.0
        return max(0, last.peer_bytes - first.peer_bytes) / span

    def origins_s(self, rest_bytes: int, *, now: float) -> float:
        """How long the origins' fallback would take to bring ``rest_bytes`` if the
        swarm brings nothing more: what is left of the stall rule's wait, then the rest
        at the best rate the web seeds delivered (inf: either is not known)."""
        if self.stall_after_s is None or self.best_web_seed_bytes_per_s <= 0:
            return math.inf
        wait_s = max(0.0, self.last_progress_at + self.stall_after_s - now)
        return wait_s + rest_bytes / self.best_web_seed_bytes_per_s


@dataclass(slots=True)
class SenderRates:
    """How fast the sender really sends each channel, from the packets-sent counters
    of its announcements (`CarouselPlan.sent_packets`) over the last ``window_s``: a
    sender short of CPU sends under its plan (flash-crowd-50: 30-47 of 50 Mbit/s),
    and the carousel then takes longer than its channels' rates say.

    min_span_s: counters closer together than this say nothing yet. 1 s.
    """

    window_s: float = 4.0
    min_span_s: float = 1.0
    _samples: deque[tuple[float, tuple[int, ...]]] = field(
        default_factory=lambda: deque(maxlen=MAX_SAMPLES)
    )

    def handle_plan(self, plan: CarouselPlan, *, now: float) -> None:
        """An announcement of the carousel arrived at ``now``."""
        counts = tuple(plan.sent_packets)
        if len(counts) != len(plan.channels):
            return
        if self._samples and (
            len(self._samples[-1][1]) != len(counts)
            or any(b < a for a, b in zip(self._samples[-1][1], counts, strict=True))
        ):
            self._samples.clear()  # another plan, or the sender restarted
        self._samples.append((now, counts))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def shares(self, plan: CarouselPlan) -> tuple[float, ...]:
        """Each channel's measured rate as a share of its planned one (at most 1; 1
        where not measured yet)."""
        ones = tuple(1.0 for _ in plan.channels)
        if len(self._samples) < 2:
            return ones
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.min_span_s or len(last) != len(plan.channels):
            return ones
        return tuple(
            min(1.0, (b - a) / (t1 - t0) / ch.packets_per_s) if ch.packets_per_s > 0 else 1.0
            for a, b, ch in zip(first, last, plan.channels, strict=True)
        )


@dataclass(frozen=True, slots=True)
class CarouselChoice:
    """The comparison at one report: leave when ``carousel_s`` < ``swarm_s`` and,
    while the swarm's peers bring nothing, ``carousel_s`` < ``origins_s``."""

    leave: bool
    swarm_s: float  # the rest from the swarm's peers (inf: they bring nothing)
    carousel_s: float  # the whole object from the carousel at the expected rate
    carousel_bytes_per_s: float  # the rate expected from the carousel
    #: the rest from the origins after the swarm's stall rule (inf: not counted, the
    #: peers still bring some, or no origin rate measured)
    origins_s: float = math.inf

    def describe(self) -> str:
        """One line for the client's notice."""
        swarm = "never" if math.isinf(self.swarm_s) else f"{self.swarm_s:.0f} s"
        origins = "" if math.isinf(self.origins_s) else f", the origins {self.origins_s:.0f} s"
        return (
            f"the carousel in about {self.carousel_s:.0f} s "
            f"({8 * self.carousel_bytes_per_s / 1e6:.1f} Mbit/s), the swarm's peers {swarm}"
            + origins
        )


def carousel_choice(
    rates: SwarmRates,
    plan: CarouselPlan,
    *,
    layering: LayeringConfig | None = None,
    sender: SenderRates | None = None,
    now: float,
) -> CarouselChoice:
    """Compare the swarm's time for the rest with the carousel's for the object
    (module docstring); ``layering``: the receiver's (its climb, `layering.climb_s`,
    from the channels the link has shown it carries); ``sender``: the rates the
    sender's announcements show (each channel at most its planned rate)."""
    layering = layering or LayeringConfig()
    shares = sender.shares(plan) if sender is not None else tuple(1.0 for _ in plan.channels)
    planned = [max(0.0, ch.rate_bps / 8) for ch in plan.channels]
    sent = [rate * share for rate, share in zip(planned, shares, strict=True)]
    rest = max(0, rates.wanted_bytes - rates.done_bytes)
    if rest == 0 or not rates.downloading:
        # the swarm has the file (it checks its copy or seeds): nothing to leave for
        # (flash-crowd-50 at 67bd461, 28 Nov 22:49: six swarm clients "left" while
        # seeding, their peers bringing nothing, and stopped seeding)
        return CarouselChoice(False, 0.0, math.inf, 0.0)
    peer = rates.peer_bytes_per_s()
    swarm_s = rest / peer if peer > 0 else math.inf
    if not planned or sum(sent) <= 0 or plan.size_bytes <= 0:
        return CarouselChoice(False, swarm_s, math.inf, 0.0)
    # the channels the link carries at their planned rates (the layering joins only
    # on windows at the planned rate), one at least; they bring what the sender sends
    # on them, at most what the link has shown
    link = rates.best_link_bytes_per_s
    held = 1
    while held < len(planned) and sum(planned[:held]) < link:
        held += 1
    expected = max(sent[0], min(link, sum(sent[:held])))
    # the receiver starts on the whole channels the link has shown it carries (the
    # layering's start, `multicast_receive._link_shown_bps`) and climbs from there as
    # the layering does (doubling); the climb brings about half of what its channels
    # would. Budgeted from one channel, a dsl-20 leaver whose swarm had shown its
    # 20 Mbit/s was charged three steps (1.2 s) it does not take
    start = channels_within(planned, link)
    carousel_s = plan.size_bytes / expected + climb_s(layering, planned, start, held) / 2
    # peers that bring nothing leave the swarm to its stall rule: the rest from the
    # origins (while they bring some, the stall rule does not end the swarm)
    origins_s = rates.origins_s(rest, now=now) if peer <= 0 else math.inf
    leave = carousel_s < swarm_s and carousel_s < origins_s
    return CarouselChoice(leave, swarm_s, carousel_s, expected, origins_s)
