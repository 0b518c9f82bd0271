"""When a swarm client leaves the swarm for the issue's carousel: the carousel's time
for the file against the swarm peers' time for the rest, from measured rates
(`pressrun.clients.carousel_switch`), and the watch that applies it
(`swarm_handoff._carousel_meanwhile`), driven with a stepped clock.

The figures are flash-crowd-50's at 2181bec (28 Nov, run 5): a 50 MB issue, a
carousel of 10 channels of 5 Mbit/s, lossy-10 readers taking 8.8 Mbit/s from peers
with 41-47% of the file when it started."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from pressrun.clients import carousel_watch
from pressrun.clients.carousel_switch import SenderRates, SwarmRates, carousel_choice
from pressrun.clients.config import ClientConfig
from pressrun.clients.swarm_handoff import _carousel_meanwhile, _swarm_progress
from pressrun.multicast.events import CarouselPlan, ChannelSpec
from pressrun.peer.events import PeerPhase
from pressrun.peer.results import SwarmProgress

MB = 1_000_000
SIZE = 50 * MB
#: 8.8 Mbit/s, what the lossy-10 leavers took from peers
PEERS_BPS = 1.1 * MB


def plan(channels: int = 10, rate_bps: float = 5e6, sent: tuple[int, ...] = ()) -> CarouselPlan:
    specs = tuple(
        ChannelSpec(f"239.255.74.{53 + c}", 5500 + c, 7, rate_bps, rate_bps / 8 / 1384)
        for c in range(channels)
    )
    return CarouselPlan("i-47", "ab" * 32, SIZE, 1, "raptorq", 1320, 37_896, 76.0, specs, sent)


def sender_at(share: float, seconds: float = 4.0, channels: int = 10) -> SenderRates:
    """A sender whose announcements (every 0.5 s) count packets at ``share`` of the plan."""
    sender = SenderRates()
    pps = plan(channels).channels[0].packets_per_s
    t = 0.0
    while t <= seconds:
        sender.handle_plan(plan(channels, sent=(int(share * pps * t),) * channels), now=t)
        t += 0.5
    return sender


def rates_after(
    seconds: float, *, peer_bps: float, web_bps: float = 0.0, done_from: int = 0
) -> SwarmRates:
    """A swarm that delivered at these rates for ``seconds``, reported every 0.5 s."""
    rates = SwarmRates(started_at=0.0)
    t = 0.0
    while t < seconds:
        t += 0.5
        peer, web = int(peer_bps * t), int(web_bps * t)
        rates.handle_progress(
            done_bytes=done_from + peer + web,
            wanted_bytes=SIZE,
            downloaded_bytes=peer + web,
            web_seed_bytes=web,
            now=t,
        )
    return rates


def test_a_swarm_leaver_of_run_5_stays_where_its_peers_finish_sooner() -> None:
    # 46% in 21 s at 8.8 Mbit/s from peers: the rest (27 MB) in about 25 s; the
    # carousel at what the link has shown (8.8 Mbit/s, 2 channels) takes the whole
    # 50 MB, about 46 s, whatever pieces are held (the least-held block decides)
    rates = rates_after(21.0, peer_bps=PEERS_BPS, done_from=int(0.46 * SIZE) - int(PEERS_BPS * 21))
    choice = carousel_choice(rates, plan(), now=21.0)
    assert not choice.leave
    assert choice.swarm_s == pytest.approx(27 * MB / PEERS_BPS, rel=0.02)
    assert choice.carousel_s == pytest.approx(SIZE / PEERS_BPS + 0.4, rel=0.02)


def test_a_swarm_that_brought_nothing_is_left_for_the_carousel_on_the_air() -> None:
    rates = rates_after(5.0, peer_bps=0.0)
    choice = carousel_choice(rates, plan(), now=5.0)
    assert choice.leave and math.isinf(choice.swarm_s)
    # one channel at least (a receiver holds one whatever its link): 80 s for 50 MB
    assert choice.carousel_s == pytest.approx(SIZE / 625_000, rel=0.01)


def test_a_swarm_fed_by_the_web_seeds_is_left_whatever_it_holds() -> None:
    # 90% done but every byte from the origins: the carousel spares them
    rates = rates_after(10.0, peer_bps=0.0, web_bps=2 * MB, done_from=int(0.5 * SIZE))
    choice = carousel_choice(rates, plan(), now=10.0)
    assert choice.leave
    # the link has shown 16 Mbit/s: 4 channels, 25 s for the file
    assert choice.carousel_bytes_per_s == pytest.approx(2 * MB, rel=0.01)


def stalled_swarm(held: float, *, stall_after_s: float | None = 20.0) -> SwarmRates:
    """A swarm that brought ``held`` of the file (the web seeds 1 MB/s for its first
    5 s, then the peers at 8.8 Mbit/s) and nothing since t = 45 (its stall rule ends it
    at 45 + ``stall_after_s``)."""
    rates = SwarmRates(started_at=0.0, stall_after_s=stall_after_s)
    web_bytes = 5 * MB
    peer_end = int(held * SIZE) - web_bytes
    t = 0.0
    while t < 50.0:
        t += 0.5
        web = int(min(t, 5.0) * MB)
        peer = 0 if t <= 5.0 else min(peer_end, int((t - 5.0) / 40.0 * peer_end))
        rates.handle_progress(
            done_bytes=web + peer,
            wanted_bytes=SIZE,
            downloaded_bytes=web + peer,
            web_seed_bytes=web,
            now=t,
        )
    return rates


def test_a_stalled_swarm_with_most_of_the_file_takes_the_rest_from_the_origins() -> None:
    # 98% held, the peers silent for 5 s: the stall rule ends the swarm in 15 s and the
    # origins (1 MB/s, as their web seeds delivered) bring the last 1 MB in 1 s more;
    # the carousel would take the whole 50 MB at what the link has shown (~45 s)
    choice = carousel_choice(stalled_swarm(0.98), plan(), now=50.0)
    assert math.isinf(choice.swarm_s)
    assert choice.origins_s == pytest.approx(15.0 + 1.0, rel=0.02)
    assert choice.carousel_s > 40.0
    assert not choice.leave, choice.describe()
    assert "the origins 16 s" in choice.describe()
    # with a fifth of the file the origins' fallback is the slower (15 + 40 s): it leaves
    choice = carousel_choice(stalled_swarm(0.2), plan(), now=50.0)
    assert choice.origins_s == pytest.approx(55.0, rel=0.02)
    assert choice.leave and choice.carousel_s < choice.origins_s
    # the stall rule not known: the origins are not counted (the rule as before)
    choice = carousel_choice(stalled_swarm(0.98, stall_after_s=None), plan(), now=50.0)
    assert choice.leave and math.isinf(choice.origins_s)


def test_the_origins_are_not_counted_while_the_peers_bring_some() -> None:
    # peers at 8.8 Mbit/s reset the stall rule's clock: the swarm's time decides
    rates = rates_after(21.0, peer_bps=PEERS_BPS, web_bps=0.5 * MB)
    rates.stall_after_s = 20.0
    assert math.isinf(carousel_choice(rates, plan(), now=21.0).origins_s)


def test_the_carousel_rate_is_at_most_every_channel() -> None:
    rates = rates_after(6.0, peer_bps=3 * MB)  # 24 Mbit/s shown, 4 channels carry 20
    choice = carousel_choice(rates, plan(channels=4), now=6.0)
    assert choice.carousel_bytes_per_s == pytest.approx(4 * 5e6 / 8)


def test_peers_that_stop_show_as_reports_with_nothing_new() -> None:
    # the peer reads its status every 0.5 s whatever arrives: peers that stop are
    # reports with the same bytes, and the window then holds nothing from them
    rates = rates_after(6.0, peer_bps=PEERS_BPS)
    assert rates.peer_bytes_per_s() == pytest.approx(PEERS_BPS, rel=0.01)
    t = 6.0
    while t < 14.0:
        t += 0.5
        rates.handle_progress(
            done_bytes=int(PEERS_BPS * 6.0),
            wanted_bytes=SIZE,
            downloaded_bytes=int(PEERS_BPS * 6.0),
            web_seed_bytes=0,
            now=t,
        )
    assert rates.peer_bytes_per_s() == 0.0
    assert carousel_choice(rates, plan(), now=14.0).leave


def test_a_late_report_is_not_a_slow_swarm() -> None:
    # client 18 of the 150-client flash crowd at e982b92 (29 Nov 01:25), a mobile-6
    # desktop: 88% of the file, 0.7 MB/s from its peers in every report, then no report
    # for 3.9 s (its own process starved, load about 100). Counting those seconds as
    # nothing delivered read the rest (5.7 MB) as about 70-110 s from the swarm, the
    # carousel (65 s for the whole object at what its link had shown) won, and the
    # carousel took 65 s where the reports either side say the swarm had about 8 s
    # left. The rate is the reports' own: the rest in about 8 s, it stays.
    peers = 0.7 * MB
    rates = rates_after(20.0, peer_bps=peers, done_from=int(0.88 * SIZE) - int(peers * 20.0))
    choice = carousel_choice(rates, plan(channels=4), now=23.9)
    assert not choice.leave, choice.describe()
    assert choice.swarm_s == pytest.approx(0.12 * SIZE / peers, rel=0.05)
    assert choice.carousel_s > 60.0
    # and a longer silence (8 s) is no more evidence: the same rate
    assert carousel_choice(rates, plan(channels=4), now=28.0).swarm_s == choice.swarm_s


def test_the_samples_kept_are_bounded() -> None:
    rates = rates_after(600.0, peer_bps=PEERS_BPS)
    assert len(rates._samples) <= 64


# -- the watch in the swarm hand-off, as the client runs it


@dataclass
class _Fetch:
    """What `_carousel_meanwhile`, `_swarm_progress` and the hand-over
    (`carousel_handover_aio`, test_swarm_handover.py) use of a `FetchState`."""

    loop: asyncio.AbstractEventLoop
    config: ClientConfig = field(
        default_factory=lambda: ClientConfig(carousel_control_group="239.255.70.1:5400")
    )
    clock: float = 0.0
    progress: Any = None
    swarm_progress: SwarmProgress | None = None
    swarm_rates: SwarmRates | None = None
    carousel_choice: str | None = None
    notices: list[str] = field(default_factory=list)
    swarm_note: str | None = None
    left_for_carousel: bool = False
    left_swarm_web_seed_bytes: int = 0
    left_swarm_peer_bytes: int = 0
    multicast_bytes: int = 0
    checked_sha256: str | None = None

    def now(self) -> float:
        return self.clock

    def notice(self, text: str, **_: Any) -> None:
        self.notices.append(text)


@dataclass
class _Manifest:
    issue_id: str = "i-47"
    publisher_key: str = "00" * 32


def _report(
    f: _Fetch,
    t: float,
    *,
    peer: int,
    web: int = 0,
    done_from: int = 0,
    phase: PeerPhase = PeerPhase.DOWNLOADING,
) -> None:
    f.clock = t
    progress = SwarmProgress(
        phase=phase,
        done_bytes=min(SIZE, done_from + peer + web),
        wanted_bytes=SIZE,
        uploaded_bytes=0,
        downloaded_bytes=peer + web,
        bytes_from_web_seeds=web,
        connected_peers=3,
    )
    _swarm_progress(f, progress)  # type: ignore[arg-type]


def _announced(*, every_s: float = 0.1, ttl_s: float = 5.0, for_s: float = math.inf) -> Any:
    """A stand-in for `watch_for_carousel`: the carousel announced every ``every_s``
    for ``for_s`` (each announcement good for ``ttl_s``), then silence."""

    def watch(*_: Any, should_stop: Any, on_plan: Any = None, **__: Any) -> Any:
        if on_plan is None:  # the first announcement is enough (the code before)
            return plan()
        waited = 0.0
        while not should_stop():
            if waited < for_s:
                on_plan(plan(), ttl_s)
            time.sleep(every_s)
            waited += every_s
        return None

    return watch


async def _watch(
    monkeypatch: pytest.MonkeyPatch,
    feed: Any,
    *,
    fetch_ends_after_s: float,
    watch: Any = None,
) -> tuple[CarouselPlan | None, _Fetch]:
    """Run the watch with a carousel on the air from the start (``watch``: how it is
    announced); ``feed(f)`` reports the swarm's progress meanwhile (a coroutine); the
    swarm fetch ends after ``fetch_ends_after_s`` unless left."""
    monkeypatch.setattr(carousel_watch, "watch_for_carousel", watch or _announced())
    f = _Fetch(loop=asyncio.get_running_loop())
    f.swarm_rates = SwarmRates(started_at=0.0)
    fetching: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(fetch_ends_after_s))
    feeding = asyncio.ensure_future(feed(f))
    try:
        got = await _carousel_meanwhile(f, _Manifest(), fetching, "ab" * 32)  # type: ignore[arg-type]
    finally:
        fetching.cancel()
        feeding.cancel()
    return got, f


def test_the_hand_off_keeps_a_leaver_of_run_5_in_the_swarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 46% of the file, 8.8 Mbit/s from peers when the carousel starts: the rule before
    # (leave below half of the file) sent it to the carousel, where it took 50 s more
    async def feed(f: _Fetch) -> None:
        base = int(0.46 * SIZE) - int(PEERS_BPS * 21)
        for step in range(1, 60):
            t = 21.0 + 0.5 * (step - 8)
            _report(f, t, peer=int(PEERS_BPS * t), done_from=base)
            await asyncio.sleep(0.01)

    got, f = asyncio.run(_watch(monkeypatch, feed, fetch_ends_after_s=0.6))
    assert got is None
    assert f.carousel_choice is None


def test_the_hand_off_leaves_a_swarm_fed_by_the_origins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 60% of the file, all of the last seconds from the web seeds: the rule before
    # kept it in the swarm (past half of the file) on the origins the carousel spares
    async def feed(f: _Fetch) -> None:
        for step in range(1, 60):
            t = 0.5 * step
            _report(f, t, peer=0, web=int(0.2 * MB * t), done_from=int(0.55 * SIZE))
            await asyncio.sleep(0.01)

    got, f = asyncio.run(_watch(monkeypatch, feed, fetch_ends_after_s=1.5))
    assert got is not None and got.issue_id == "i-47"
    assert f.carousel_choice is not None and "peers never" in f.carousel_choice


async def _peers_stop_at_4_s(f: _Fetch) -> None:
    """Half of the file held, peers at 3 MB/s for 4 s, then nothing from them."""
    peer = 0
    for step in range(1, 200):
        t = 0.5 * step
        if t <= 4.0:
            peer = int(3 * MB * t)
        _report(f, t, peer=peer, done_from=int(0.5 * SIZE))
        await asyncio.sleep(0.02)


def test_the_hand_off_judges_again_when_the_peers_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # past half of the file with fast peers: it stays; the peers then stop, and the
    # carousel still on the air is taken (the rule before judged once, at the start)
    got, f = asyncio.run(_watch(monkeypatch, _peers_stop_at_4_s, fetch_ends_after_s=3.0))
    assert got is not None
    assert f.carousel_choice is not None


def test_the_hand_off_takes_no_carousel_whose_announcements_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # past half of the file with fast peers: it stays; the carousel is announced for
    # 0.2 s (each announcement good for 0.3 s by the stepped clock's measure) and the
    # peers stop later: a carousel no longer on the air is not left for
    got, _ = asyncio.run(
        _watch(
            monkeypatch,
            _peers_stop_at_4_s,
            fetch_ends_after_s=1.5,
            watch=_announced(every_s=0.05, ttl_s=0.3, for_s=0.2),
        )
    )
    assert got is None


def test_a_swarm_that_has_the_file_is_never_left() -> None:
    rates = rates_after(10.0, peer_bps=PEERS_BPS, done_from=SIZE - int(PEERS_BPS * 10))
    # done: the peers then bring nothing, as nothing is missing
    rates.handle_progress(
        done_bytes=SIZE,
        wanted_bytes=SIZE,
        downloaded_bytes=int(PEERS_BPS * 10),
        web_seed_bytes=0,
        now=20.0,
        downloading=False,
    )
    choice = carousel_choice(rates, plan(), now=20.0)
    assert not choice.leave and choice.swarm_s == 0.0


def test_the_hand_off_leaves_no_seeding_client(monkeypatch: pytest.MonkeyPatch) -> None:
    # the swarm brought the file and seeds when the carousel starts; on 38201e5 it
    # "left" (its peers brought nothing more) and stopped seeding (flash-crowd-50 at
    # 67bd461: six swarm clients)
    async def feed(f: _Fetch) -> None:
        for step in range(1, 60):
            t = 0.5 * step
            _report(f, t, peer=SIZE, phase=PeerPhase.SEEDING)
            await asyncio.sleep(0.01)

    got, f = asyncio.run(_watch(monkeypatch, feed, fetch_ends_after_s=0.6))
    assert got is None and f.carousel_choice is None


def test_a_slow_sender_makes_the_carousel_slower() -> None:
    # a lossy-10 reader of the run at 67bd461 (client 12): 42% of the file, its peers'
    # rate fallen to about 4.4 Mbit/s (the rest in 52 s), its link shown at 10 Mbit/s:
    # the carousel at its plan (2 channels, about 41 s) is sooner; with the sender at
    # 60% of its plan (30 of 50 Mbit/s, as in run 5) it is not (about 67 s)
    rates = rates_after(20.0, peer_bps=0.55 * MB, web_bps=0.0, done_from=10 * MB)
    rates.best_link_bytes_per_s = 1.25 * MB
    full = carousel_choice(rates, plan(), sender=sender_at(1.0), now=20.0)
    slow = carousel_choice(rates, plan(), sender=sender_at(0.6), now=20.0)
    assert full.leave and full.carousel_s == pytest.approx(40.4, abs=0.5)
    assert not slow.leave and slow.carousel_bytes_per_s == pytest.approx(0.75 * MB, rel=0.01)
    assert slow.carousel_s > slow.swarm_s


def test_the_sender_counters_are_forgotten_when_they_restart() -> None:
    sender = sender_at(0.5)
    assert sender.shares(plan()) == pytest.approx((0.5,) * 10, rel=0.01)
    # a restarted sender counts from 0 again: nothing measured yet
    sender.handle_plan(plan(sent=(10,) * 10), now=5.0)
    assert sender.shares(plan()) == (1.0,) * 10


@pytest.mark.parametrize(
    ("link_mbps", "climb_s"),
    [(20.0, 0.0), (16.0, 0.8), (50.0, 0.0), (8.8, 0.5), (0.0, 0.0)],
)
def test_the_climb_is_budgeted_from_the_channels_the_link_has_shown(
    link_mbps: float, climb_s: float
) -> None:
    """A leaver starts on the whole channels its link has shown it carries
    (`LayerCore.channels_within`) and climbs from there, doubling (`layering.climb_s`):
    a link shown at 20 Mbit/s starts on the 4 channels it carries and climbs none;
    at 16 Mbit/s on 3, one step to 4 (settling and a window); at 8.8 Mbit/s on 1, one
    step to 2 (a window: a one-channel start has no settling). Half the climb is
    counted, as it brings about half of what its channels would. Budgeted from one
    channel a join (before): 1.2, 1.2, 3.6, 0.4 and 0 s."""
    rates = rates_after(5.0, peer_bps=0.0)
    rates.best_link_bytes_per_s = link_mbps * 1e6 / 8
    choice = carousel_choice(rates, plan(), now=5.0)
    expected = max(625_000.0, min(rates.best_link_bytes_per_s, 6.25 * MB))
    assert choice.carousel_bytes_per_s == pytest.approx(expected)
    assert choice.carousel_s == pytest.approx(SIZE / expected + climb_s / 2)
