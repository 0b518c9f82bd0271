"""The ring client's pacing: when a piece is asked about again, when a change is worth
a round now (the rounds over HTTP: tests/integration/test_chord_ring.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from fronts import served
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.ring_client import RingClient


class Pieces:
    """What the peer's status says: the pieces held, those no connected peer holds,
    those one holds."""

    def __init__(self, n: int) -> None:
        self.have = [False] * n
        self.unheld: set[int] = set()
        self.lonely: set[int] = set()


def ring_client(
    pieces: Pieces,
    tracker_base: str = "http://127.0.0.1:9",
    *,
    peer_id: str = "aa",
    policy: ChordPolicy | None = None,
    interval_s: float = 2.0,
    min_gap_s: float = 0.25,
    reask_s: float = 3.0,
    view_refresh_s: float = 10.0,
) -> RingClient:
    """A ring client whose status is ``pieces``, asking ``tracker_base`` (by default a
    port nobody answers on), with the given pacing (RingClient's defaults)."""
    return RingClient(
        tracker_base=tracker_base,
        info_hash="12" * 20,
        num_pieces=len(pieces.have),
        peer_id=peer_id,
        address="127.0.0.1:7",
        policy=policy or ChordPolicy(),
        have=lambda: tuple(pieces.have),
        unheld=lambda: pieces.unheld,
        lonely=lambda: pieces.lonely,
        totals=lambda: (0, 0),
        connect=lambda host, port: None,
        interval_s=interval_s,
        min_gap_s=min_gap_s,
        reask_s=reask_s,
        view_refresh_s=view_refresh_s,
    )


def client(pieces: Pieces) -> RingClient:
    c = ring_client(pieces, reask_s=3.0)
    c._keys = list(range(len(pieces.have)))  # (the ring's view has been read)
    return c


def test_a_waiting_piece_is_asked_again_later_each_time_and_at_once_on_a_new_holder() -> None:
    c = client(Pieces(4))
    assert c._may_ask(1, False, 0.0)
    c._answered(1, 0.0, wait=True)  # nobody can upload it yet: again after 1 s
    assert not c._may_ask(1, False, 0.9) and c._may_ask(1, False, 1.0)
    c._answered(1, 1.0, wait=True)  # then 2 s
    assert not c._may_ask(1, False, 2.9) and c._may_ask(1, False, 3.0)
    c._answered(1, 3.0, wait=True)  # then reask_s (not 4 s)
    assert not c._may_ask(1, False, 5.9) and c._may_ask(1, False, 6.0)
    c._answered(1, 6.0, wait=True)
    # it got its one connected holder: the ring's answer changes (first receivers)
    assert c._may_ask(1, True, 6.1)
    c._answered(1, 6.1, wait=True)  # (the waits count from 1 s again)
    assert c._may_ask(1, True, 7.1)
    # an answer naming an uploader: asked again after reask_s
    c._answered(1, 7.1, wait=False)
    assert not c._may_ask(1, True, 10.0) and c._may_ask(1, True, 10.1)


def test_a_round_now_only_for_a_change_the_ring_waits_on() -> None:
    pieces = Pieces(6)
    c = client(pieces)
    pieces.unheld, pieces.lonely = {0, 1, 2}, {2}
    assert c._urgent(0.0)  # pieces never asked about
    for p in (0, 1, 2):
        c._may_ask(p, p == 2, 0.0)
        c._answered(p, 0.0, wait=True)
    c._reported.update({5: "sn"})
    assert not c._urgent(0.5)  # asked, answered wait: nothing new
    pieces.have[3] = True  # a common piece arrived: the next round reports it
    assert not c._urgent(0.6)
    pieces.have[1] = True  # a piece nobody connected held arrived: at once
    pieces.unheld = {0, 2}
    assert c._urgent(0.7)
    c._reported[1] = "sn"
    assert not c._urgent(0.8)
    pieces.lonely = {0, 2}  # piece 0 got its one holder: asked at once
    assert c._urgent(0.9)
    c._may_ask(0, True, 0.9)
    c._answered(0, 0.9, wait=True)
    c._answered(2, 0.9, wait=True)  # (its second wait: 2 s)
    assert not c._urgent(1.0)
    assert c._urgent(1.9)  # piece 0's wait is over
    c._bring_in = {4}  # a piece it was to bring in arrived
    c._answered(0, 1.9, wait=True)
    c._answered(2, 1.9, wait=True)
    pieces.have[4] = True
    assert c._urgent(2.0)


def test_a_new_piece_of_one_connected_holder_is_asked_about_with_the_other_window_full() -> None:
    # The pieces one connected peer holds have a window of their own in a round
    # (`_window`), but whether a nudge was worth a round now counted the pieces waiting
    # on an answer over both windows: once a peer had asked about eight pieces nobody
    # connected held (its first round), a piece a neighbour had just brought in was
    # asked about only at the next regular round, up to ``interval_s`` (2 s) later,
    # while its holder's upload waited on the ring naming its first receivers.
    pieces = Pieces(160)
    pieces.unheld = set(range(160))
    c = client(pieces)
    for p in range(8):  # the first round: eight pieces nobody connected holds, `wait`
        c._may_ask(p, False, 0.0)
        c._answered(p, 0.0, wait=True)
    assert not c._urgent(0.5)
    pieces.unheld.discard(100)  # a neighbour brought piece 100 in: one connected holder
    pieces.lonely = {100}
    assert c._urgent(0.6)  # (before: not until the 8 waits were over, or the next round)
    # with eight pieces of one holder asked about and waiting, a ninth waits its turn
    lonely = set(range(100, 108))
    for p in lonely:
        c._may_ask(p, True, 0.6)
        c._answered(p, 0.6, wait=True)
    pieces.unheld -= lonely
    pieces.lonely = lonely
    assert not c._urgent(0.7)
    pieces.unheld.discard(120)
    pieces.lonely = lonely | {120}
    assert not c._urgent(0.8)


@contextlib.asynccontextmanager
async def ringless_tracker() -> AsyncIterator[tuple[str, list[float]]]:
    """A real tracker front on loopback that has no ring for the issue (404): its base
    URL, and when each ring view was asked for."""
    asked: list[float] = []

    async def ring(request: web.Request) -> web.Response:
        asked.append(asyncio.get_running_loop().time())
        return web.json_response({"error": "no ring for this issue"}, status=404)

    app = web.Application()
    app.router.add_get("/v1/ring/{info_hash}", ring)
    async with served(app) as tracker:
        yield tracker, asked


def live_client(
    tracker: str,
    policy: ChordPolicy,
    *,
    interval_s: float,
    min_gap_s: float,
    view_refresh_s: float = 10.0,
) -> RingClient:
    """A ring client of a 4-piece issue asking ``tracker``, with the given pacing."""
    return ring_client(
        Pieces(4),
        tracker,
        policy=policy,
        interval_s=interval_s,
        min_gap_s=min_gap_s,
        view_refresh_s=view_refresh_s,
    )


async def test_without_a_ring_the_tracker_is_asked_once_per_view_refresh() -> None:
    # `chord` is the default policy: where no supernode runs, every peer's ring client
    # finds no ring (404) and the policy is `stripes`; it must not ask the tracker
    # again every round, only every view_refresh_s
    policy = ChordPolicy()
    async with ringless_tracker() as (tracker, asked):
        c = live_client(tracker, policy, interval_s=0.1, min_gap_s=0.05, view_refresh_s=1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            c.start()
            # 1.5 s, or until 8 rounds ran (a loaded host runs fewer a second: 6 in
            # 1.5 s at load 70-150), 10 s at most
            while loop.time() - started < 1.5 or (
                c.stats.rounds < 8 and loop.time() - started < 10
            ):
                await asyncio.sleep(0.05)
        finally:
            await c.close()
        elapsed = loop.time() - started
    assert policy.ring_absent and not policy.ring_ready  # `stripes`
    assert c.stats.rounds >= 8  # it kept running rounds ...
    # ... and asked the tracker once a view refresh only (at 0 s, 1 s, ...)
    assert 2 <= len(asked) <= int(elapsed / 1.0) + 1, (asked, elapsed)
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(asked)), asked


async def test_close_ends_the_rounds_when_a_nudge_comes_with_it() -> None:
    # A peer leaving the swarm nudges (a status poll) and closes in the same moment.
    # Python 3.11's wait_for lost the cancellation then (it returned the event's
    # result), the rounds ran on and close() waited forever: 2 of 150 clients of an
    # emulated flash crowd never left the swarm for the carousel.
    loop = asyncio.get_running_loop()
    async with ringless_tracker() as (tracker, _):
        for _ in range(10):
            c = live_client(tracker, ChordPolicy(), interval_s=30.0, min_gap_s=0.01)
            c.start()
            await asyncio.sleep(0.1)  # the first round is over: waiting for a nudge
            rounds = c._task
            assert rounds is not None and not rounds.done()
            c.nudge()
            started = loop.time()
            async with asyncio.timeout(10):  # (before: forever)
                await c.close()
            assert loop.time() - started < 1.0  # not the CLOSE_WAIT_S fallback
            assert rounds.cancelled()


async def test_leaving_stops_the_rounds_before_the_torrent_goes() -> None:
    # the peer removes its torrent right after `leave`: a round after that read a gone
    # libtorrent handle ("invalid torrent handle used") and the rounds died on it
    async with ringless_tracker() as (tracker, _):
        c = live_client(tracker, ChordPolicy(), interval_s=0.05, min_gap_s=0.01)
        c.start()
        await asyncio.sleep(0.2)
        rounds = c._task
        assert rounds is not None
        await c.leave()
        assert rounds.cancelled()
        before = c.stats.rounds
        await asyncio.sleep(0.2)
        assert c.stats.rounds == before  # no round after leaving
        await c.close()


def one_supernode_ring(
    num_pieces: int,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The tracker front's ``GET /v1/ring/<info_hash>``: ``num_pieces`` pieces and one
    supernode, the loopback server that answers it."""

    async def ring(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "num_pieces": num_pieces,
                "piece_keys": [f"{k:040x}" for k in range(num_pieces)],
                "supernodes": [{"id": "f" * 40, "address": request.host}],
            }
        )

    return ring


@contextlib.asynccontextmanager
async def waiting_ring(num_pieces: int) -> AsyncIterator[tuple[str, list[list[int]]]]:
    """A tracker front listing one supernode, which is this same loopback server and
    answers ``wait`` for every piece asked about: its base URL, and the ``want`` list
    of every question it got."""
    wants: list[list[int]] = []

    ring = one_supernode_ring(num_pieces)

    async def pieces(request: web.Request) -> web.Response:
        doc = await request.json()
        wants.append(list(doc.get("want", [])))
        return web.json_response(
            {"uploaders": [{"piece": p, "address": "", "wait": True} for p in doc["want"]]}
        )

    app = web.Application()
    app.router.add_get("/v1/ring/{info_hash}", ring)
    app.router.add_post("/chord/v1/pieces", pieces)
    async with served(app) as base:
        yield base, wants


async def test_a_round_asks_about_a_window_of_pieces_not_every_piece_it_lacks() -> None:
    # At N = 40 (160 pieces) every peer asked about every piece nobody connected held,
    # each round: 47,283 answers, nearly all `wait`; the answers grew with pieces x
    # peers. A round now asks about at most `max_wants` of them (before: all 160 in
    # the first question), and a peer whose window is answered `wait` does not run a
    # round at every nudge.
    pieces = Pieces(160)
    pieces.unheld = set(range(160))
    async with waiting_ring(160) as (base, wants):
        c = ring_client(pieces, base, peer_id="ab" * 20, interval_s=0.5, min_gap_s=0.05)
        c.start()
        try:
            for _ in range(10):  # a status poll every 0.1 s nudges it
                await asyncio.sleep(0.1)
                c.nudge()
            await asyncio.sleep(0.5)
        finally:
            await c.close()
    asked = [w for w in wants if w]
    assert asked, wants
    assert max(len(w) for w in asked) <= 8, [len(w) for w in asked]
    # (1.5 s: a round at 0, the window asked again after its 1 s wait, ...)
    assert c.stats.waits <= 4 * 8, c.stats.waits
    # its own order: from its place among the pieces, not all from piece 0
    assert asked[0] != list(range(8))


async def test_a_piece_one_connected_peer_holds_is_asked_about_at_once() -> None:
    # A piece one connected peer holds is held off until the ring names this peer a
    # first receiver (or a second holder exists), and its source's upload waits on the
    # naming. In one window of eight in the peer's own order, it was asked about only
    # once the rotation over the 160 pieces nobody holds reached it: on the loopback
    # bench at N = 20 the first pieces brought in had their first receivers named 1 to
    # 3 s late. Now the pieces one connected peer holds have a window of their own.
    pieces = Pieces(160)
    pieces.unheld = set(range(160))
    start = zlib.crc32(("ab" * 20).encode()) % 160
    far = (start + 100) % 160  # far from the start of this peer's own order
    pieces.unheld.discard(far)
    pieces.lonely = {far}
    async with waiting_ring(160) as (base, wants):
        c = ring_client(pieces, base, peer_id="ab" * 20, interval_s=0.5, min_gap_s=0.05)
        c.start()
        try:
            async with asyncio.timeout(5):
                while not [w for w in wants if w]:
                    await asyncio.sleep(0.02)
        finally:
            await c.close()
    first = next(w for w in wants if w)
    assert far in first, first  # (before: the first eight of the 159 nobody holds)
    # the pieces nobody holds keep a window of eight beside it
    assert len([p for p in first if p != far]) == 8, first


async def test_leaving_does_not_wait_for_the_supernodes_answers() -> None:
    # The peer's leave (the tracker's `stopped`, its resume data, the torrent's
    # removal) waited for the ring's answers to its `left` report first, up to 2 s on a
    # loaded host, in every `chord` client's download time (a client's download ends
    # once its peer left). Now `leave` sends the reports and returns; `close`, after
    # the rest of the leave, lets them finish.
    loop = asyncio.get_running_loop()
    lefts: list[float] = []

    ring = one_supernode_ring(4)

    async def pieces(request: web.Request) -> web.Response:
        if (await request.json()).get("left"):
            await asyncio.sleep(1.5)  # a supernode on a loaded host
            lefts.append(loop.time())
        return web.json_response({"uploaders": []})

    app = web.Application()
    app.router.add_get("/v1/ring/{info_hash}", ring)
    app.router.add_post("/chord/v1/pieces", pieces)
    async with served(app) as base:
        c = ring_client(Pieces(4), base, interval_s=0.1, min_gap_s=0.05)
        c.start()
        async with asyncio.timeout(5):
            while not c._owner:  # the ring's view was read: it knows its supernode
                await asyncio.sleep(0.02)
        started = loop.time()
        await c.leave()
        assert loop.time() - started < 0.5  # (before: 1.5 s, the supernode's answer)
        assert not lefts
        await c.close()
        assert len(lefts) == 1  # the report was made, and answered before the close


async def test_an_uploader_named_outside_the_first_receivers_reaches_the_policy() -> None:
    # piece 1 (one connected holder) is answered with an uploader, not `first`: the
    # policy hears it (`ChordPolicy.given`: no hold on it); piece 2 is named `first`
    ring = one_supernode_ring(4)

    async def pieces(request: web.Request) -> web.Response:
        doc = await request.json()
        answers = {1: {"address": "127.0.0.1:9"}, 2: {"address": "127.0.0.1:9", "first": True}}
        return web.json_response(
            {"uploaders": [{"piece": p, **answers[p]} for p in doc["want"] if p in answers]}
        )

    app = web.Application()
    app.router.add_get("/v1/ring/{info_hash}", ring)
    app.router.add_post("/chord/v1/pieces", pieces)
    policy = ChordPolicy()
    status = Pieces(4)
    status.lonely = {1, 2}
    async with served(app) as base:
        c = ring_client(status, base, policy=policy, interval_s=0.1, min_gap_s=0.05)
        c.start()
        try:
            async with asyncio.timeout(5):
                while not policy.ring_ready:
                    await asyncio.sleep(0.02)
        finally:
            await c.close()
    assert policy.given == {1} and policy.first == {2}


async def test_a_peer_that_becomes_a_seed_tells_every_supernode_at_once() -> None:
    # A supernode gives a seed's pieces to every asker, not through first receivers
    # (`PieceDirectory.choose_uploader`), and knows a seed by its report's `missing`
    # of 0. The supernode of the last piece hears it with that piece; the others
    # heard it at their keepalive only, up to 10 s later.
    loop = asyncio.get_running_loop()
    told: dict[str, list[tuple[float, int | None]]] = {"a": [], "b": []}
    hosts: dict[str, str] = {}

    def supernode(name: str) -> web.Application:
        async def pieces(request: web.Request) -> web.Response:
            told[name].append((loop.time(), (await request.json()).get("missing")))
            return web.json_response({"uploaders": []})

        async def ring(request: web.Request) -> web.Response:
            # pieces 0 and 1 are a's keys, 2 and 3 b's (Chord successors)
            return web.json_response(
                {
                    "num_pieces": 4,
                    "piece_keys": [f"{k:040x}" for k in range(4)],
                    "supernodes": [
                        {"id": f"{1:040x}", "address": hosts["a"]},
                        {"id": f"{3:040x}", "address": hosts["b"]},
                    ],
                }
            )

        app = web.Application()
        app.router.add_get("/v1/ring/{info_hash}", ring)
        app.router.add_post("/chord/v1/pieces", pieces)
        return app

    status = Pieces(4)
    status.have = [True, True, True, False]
    status.unheld = {3}
    async with served(supernode("a")) as a, served(supernode("b")) as b:
        hosts.update(a=a.removeprefix("http://"), b=b.removeprefix("http://"))
        c = ring_client(status, a, interval_s=2.0, min_gap_s=0.05)
        c._missing = lambda: status.have.count(False)
        c.start()
        try:
            async with asyncio.timeout(5):
                while not (told["a"] and told["b"]):
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            status.have[3], status.unheld = True, set()  # its last piece (b's key)
            done_at = loop.time()
            c.nudge()
            async with asyncio.timeout(5):
                while not all(any(m == 0 for _, m in told[s]) for s in "ab"):
                    await asyncio.sleep(0.02)
        finally:
            await c.close()
    heard_a = min(t for t, m in told["a"] if m == 0)
    assert heard_a - done_at < 1.0  # (before: at a's keepalive, 10 s after its last report)
