"""A peer's side of the Chord ring: report pieces, ask who uploads, connect to them.

The peer never waits for the ring: libtorrent keeps downloading with its own choices
from every peer it is connected to, and the ring's answers only raise priorities (the
pieces this peer is to bring in from the origins) and add connections (the holders it
is pointed at). A round (docs/chord.md):

1. the ring's view from the tracker (``GET /v1/ring/{info_hash}``: piece keys and the
   issue's supernodes; 404: no ring yet, the policy stays `stripes`), read again every
   ``view_refresh_s`` or after a supernode failed;
2. which supernode answers for each piece key: the Chord successor of the key among
   the listed supernodes' ids (the tracker's list is the ring's membership, so a new
   peer asks its first questions without waiting for a lookup), leaving out the
   supernodes this client found silent (their successors took their keys over); a
   piece whose guessed owner answers ``not_mine`` (the ring is changing) is looked up
   through the ring, one batch asked of a supernode (``POST /chord/v1/lookup``). An
   owner is kept until that supernode fails or says ``not_mine``;
3. to each of those supernodes, one ``POST /chord/v1/pieces`` with everything at once:
   the pieces of its keys this peer got since the last report, its upload/download
   totals and upload rate (``upload_bps``: the supernode picks owing holders that can
   pay back soonest first), its download rate, the upload it left unused over the
   last 2 s and the pieces it lacks (``download_bps``, ``unused_upload_bps``,
   ``missing``: the order of the askers), the peers it would serve now (``unchoked``:
   those it unchokes, or every connected downloading peer while it has an upload slot
   free, `pressrun.peer.sources.PeerInfoTally.served_ids`; the first receivers of a
   piece it alone holds are named among them), how many pieces it
   is bringing in from the origins for the whole ring now (``bringing``; a piece it
   brought in and holds alone does not count: with one piece at a time a bringer
   that had to wait for a second holder left the origins idle, 1.43x the bound at N =
   20 against 1.28x) and has brought in so far
   (``brought``), and the pieces it wants that *no connected peer holds or one holds*
   (the others libtorrent fetches by itself; each asked again at most every
   ``reask_s``; one answered ``wait`` after 1 s, then 2 s, then ``reask_s``, and at
   once when it gets or loses its one connected holder). A supernode with nothing new
   to hear is told only every ``keepalive_s`` (it forgets holders silent for 30 s).
   The answers: an uploader for a piece (libtorrent ``connect_peer`` to it;
   ``first``: this peer is one of the piece's first receivers, it takes it at top
   priority) or ``bring_in`` (this peer fetches it from the origins:
   `ChordPolicy.set_ring_answers`, then ``on_answers`` so the peer applies them at
   once, not at its next status poll).

Rounds run every ``interval_s``, and sooner (at most every ``min_gap_s``) when
`nudge` says the pieces changed and the ring is waiting on it (`_urgent`): a piece it
brought in, was named a first receiver of or asked the ring about arrived (reported
at once: its supernode hands this peer the next one, and the piece's other askers
stop waiting for a second holder), or a piece it lacks got or lost its one connected
holder; only the supernodes concerned are told then. A common piece that arrived
is reported to its supernode at most every ``interval_s``: reporting every piece at
once cost 75 rounds and 190 requests per peer at N = 40 (docs/chord.md).

A supernode that does not answer within ``timeout_s`` (``lookup_timeout_s`` for a
batch of lookups) is dropped from the cache; the next round asks another supernode to
look the keys up again (the ring has routed around the dead one, and its successor
rebuilds what it answered for from these reports). One that did not answer a report
(a timeout, an answer that was not 200) is left out of the owners guessed and named
``failed`` in lookups until it answers again or for ``failed_forget_s``
(`FAILED_FORGET_S`), at most `MAX_FAILED` of them. On leaving, one last report says
``left`` so no supernode picks this peer again. One HTTP session (keep-alive) for all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pressrun.chord.codec import CodecError, id_hex, parse_id, parse_node
from pressrun.chord.pieces import successor_of
from pressrun.chord.post import post_json
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.ring_pacing import (
    FAILED_FORGET_S,
    MAX_FAILED,
    MAX_WANTS,
    AskPacing,
    SilentSupernodes,
)

log = logging.getLogger(__name__)

#: how long `RingClient.close` waits for the rounds to end after cancelling them
CLOSE_WAIT_S = 5.0
#: how long the ``left`` reports of `RingClient.leave` may take (the leave waited
#: for them as long before it went on; now `close` does, after the rest of the leave)
LEFT_WAIT_S = 2.0

#: supernodes asked to look keys up in one round
_RESOLVE_TRIES = 2


@dataclass(slots=True)
class RingClientStats:
    """What a ring client did: rounds, requests and answers (the bench prints them)."""

    rounds: int = 0
    requests: int = 0
    uploaders: int = 0
    bring_in: int = 0
    first: int = 0  # answers naming this peer a first receiver
    waits: int = 0  # answers saying nobody can upload the piece yet (asked again soon)
    connects: int = 0
    lookups: int = 0
    supernode_failures: int = 0
    #: the supernodes found silent at some time (a record for the reports, at most
    #: MAX_FAILED; those left out now: `RingClient._failed`)
    failed_supernodes: set[str] = field(default_factory=set)


class RingClient:
    """One peer's link to its issue's ring (module docstring)."""

    def __init__(
        self,
        *,
        tracker_base: str,
        info_hash: str,
        num_pieces: int,
        peer_id: str,
        address: str,
        policy: ChordPolicy,
        have: Callable[[], Sequence[bool] | None],
        unheld: Callable[[], Collection[int]],
        lonely: Callable[[], Collection[int]] = frozenset,
        totals: Callable[[], tuple[int, int]],
        connect: Callable[[str, int], None],
        brought: Callable[[], int] = lambda: 0,
        upload_bps: Callable[[], int] = lambda: 0,
        unused_upload_bps: Callable[[], int | None] = lambda: None,
        download_bps: Callable[[], int] = lambda: 0,
        bring_bps: Callable[[], int] = lambda: 0,
        missing: Callable[[], int | None] = lambda: None,
        unchoked: Callable[[], Sequence[str] | None] = tuple,
        on_answers: Callable[[], None] = lambda: None,
        interval_s: float = 2.0,
        min_gap_s: float = 0.25,
        reask_s: float = 3.0,
        keepalive_s: float = 10.0,
        view_refresh_s: float = 10.0,
        timeout_s: float = 3.0,
        lookup_timeout_s: float = 6.0,
        failed_forget_s: float = FAILED_FORGET_S,
        max_wants: int = MAX_WANTS,
        seed: int | None = None,
    ) -> None:
        self.tracker_base = tracker_base.rstrip("/")
        self.info_hash = info_hash
        self.num_pieces = num_pieces
        self.peer_id = peer_id
        self.address = address
        self.policy = policy
        self._have = have
        self._unheld = unheld
        self._lonely = lonely
        self._totals = totals
        self._connect = connect
        self._brought = brought
        self._upload_bps = upload_bps
        self._unused_upload_bps = unused_upload_bps
        self._download_bps = download_bps
        self._bring_bps = bring_bps
        self._missing = missing
        self._unchoked = unchoked
        self._on_answers = on_answers
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self.keepalive_s = keepalive_s
        self.view_refresh_s = view_refresh_s
        self.timeout_s = timeout_s
        self.lookup_timeout_s = lookup_timeout_s
        self.rng = random.Random(seed)
        self.stats = RingClientStats()
        self._keys: list[int] = []
        self._supernodes: list[str] = []
        self._ids: dict[int, str] = {}  # listed supernode id -> address
        #: pieces whose owner by the list answered ``not_mine``: looked up in the ring
        self._misplaced: set[int] = set()
        #: supernodes found silent lately: `_silent`
        self._failed = SilentSupernodes(forget_s=failed_forget_s)
        self._view_at: float | None = None
        self._owner: dict[int, str] = {}  # piece -> supernode address
        self._reported: dict[int, str] = {}  # held piece -> the supernode told of it
        self._last_report: dict[str, float] = {}  # supernode -> when last told anything
        #: when each piece may be asked about again, and which a round asks about
        self._pacing = AskPacing(
            peer_id=peer_id, num_pieces=num_pieces, reask_s=reask_s, max_wants=max_wants
        )
        #: the pieces it lacked with at most one connected holder when last looked at
        self._rare: set[int] = set()
        self._bring_in: set[int] = set()
        self._first: set[int] = set()
        #: pieces the ring named an uploader for outside the first receivers
        self._given: set[int] = set()
        self._connected: set[str] = set()
        self._wake = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        #: the ``left`` reports `leave` sent (`close` waits for them)
        self._leaving: asyncio.Task[Any] | None = None
        #: the supernodes told that this peer lacks nothing (since it last lacked a piece)
        self._told_done: set[str] = set()

    def start(self) -> None:
        """Start the rounds (in the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    def nudge(self) -> None:
        """The pieces changed: run the next round soon (at most every ``min_gap_s``)
        if the ring is waiting on the change (module docstring)."""
        self._wake.set()

    async def close(self) -> None:
        """Stop the rounds, let the ``left`` reports `leave` sent finish (at most
        `LEFT_WAIT_S`) and close the HTTP session."""
        await self._stop_rounds()
        if self._leaving is not None:
            with contextlib.suppress(Exception):
                await self._leaving
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def _stop_rounds(self) -> None:
        # (they get CLOSE_WAIT_S to end: a peer leaving the swarm never waits on them
        # for good)
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CLOSE_WAIT_S)
        if not done:
            log.warning("ring client: its rounds did not stop in %.0f s", CLOSE_WAIT_S)
        elif not task.cancelled() and task.exception() is not None:
            log.warning("ring client: its rounds had stopped on %r", task.exception())

    async def leave(self) -> None:
        """Stop the rounds (the torrent is removed next: they would read a gone
        handle) and start telling every supernode this peer knows that it left (best
        effort): the answers are not waited for here, `close` waits for them at most
        `LEFT_WAIT_S`. The peer's leave goes on meanwhile (the tracker's ``stopped``,
        the resume data, the torrent's removal), and a client's download ends only
        once its peer has left: waiting for the supernodes first put up to 2 s of
        their answers on a loaded host into every `chord` client's download time,
        which `stripes` never paid."""
        await self._stop_rounds()
        if self._http is None or self._leaving is not None:
            return
        owners = set(self._owner.values())
        up, down = self._totals()
        body = {
            "peer_id": self.peer_id,
            "address": self.address,
            "uploaded": up,
            "downloaded": down,
            "left": True,
        }
        if owners:
            self._leaving = asyncio.get_running_loop().create_task(
                asyncio.wait(
                    [asyncio.ensure_future(self._post(o, "pieces", body)) for o in owners],
                    timeout=LEFT_WAIT_S,
                )
            )

    # --- the loop ----------------------------------------------------------------

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._http = aiohttp.ClientSession(timeout=timeout)
        while True:
            self._wake.clear()
            try:
                await self._round()
            except (aiohttp.ClientError, TimeoutError, CodecError, ValueError) as err:
                log.debug("ring round failed: %s", err)
            self.stats.rounds += 1
            await asyncio.sleep(self.min_gap_s)
            loop = asyncio.get_running_loop()
            until = loop.time() + self.interval_s - self.min_gap_s
            while (left := until - loop.time()) > 0:
                # (asyncio.timeout, not wait_for: Python 3.11's wait_for returns the
                # event's result when the task is cancelled as the event is set, the
                # cancellation lost; this loop then ran on and `close` waited forever,
                # 2 of 150 clients of an emulated flash crowd stuck leaving the swarm)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._wake.wait()
                if not self._wake.is_set() or self._urgent(loop.time()):
                    break
                self._wake.clear()

    def _urgent(self, now: float) -> bool:
        # a change the ring is waiting on (module docstring): a piece not reported yet
        # that it brings in, was named first for, or had at most one connected holder
        # when last looked at; a piece it lacks that may be asked about now
        have = self._have()
        if have is None or not self._keys:
            return True
        lonely = set(self._lonely())
        rare = {*self._unheld(), *lonely}
        watched = self._rare | self._bring_in | self._first
        self._rare = rare
        if any(have[p] and p not in self._reported for p in watched):
            return True
        if self._seed(have) and any(o not in self._told_done for o in self._last_report):
            return True  # a seed now: every supernode hears it at once (`_round`)
        lacked = [p for p in rare if not have[p]]
        return self._pacing.worth_a_round(lacked, lonely, now)

    async def _round(self) -> None:
        now = asyncio.get_running_loop().time()
        stale = self._view_at is None or now - self._view_at >= self.view_refresh_s
        if stale:
            await self._refresh_view(now)
        if not self._supernodes:
            # no ring (yet): `stripes`; the tracker is asked again every view_refresh_s
            # (where no supernode runs, every peer's `chord` policy is `stripes` and
            # must not ask the tracker every round)
            self.policy.ring_lost()
            return
        have = self._have()
        if have is None:
            return
        unowned = [p for p in range(self.num_pieces) if p not in self._owner]
        self._guess_owners(unowned, now)
        unowned = [p for p in unowned if p not in self._owner]
        if unowned:
            await self._resolve(unowned, now)
        # (asked about: the pieces no connected peer holds, and those one holds: the
        # ring names who takes those first)
        lonely = set(self._lonely())
        watched = self._rare | self._bring_in | self._first
        unheld = self._rare = {*self._unheld(), *lonely}
        wanted = [p for p in unheld if not have[p] and p in self._owner]
        if any(have[p] and p not in self._reported for p in self._bring_in):
            # a piece it brought in, reported now: ask for the next in the same request
            self._pacing.ask_again([p for p in wanted if p not in lonely], now)
        asking = self._pacing.window(wanted, lonely, now)
        up, down = self._totals()
        by_owner: dict[str, tuple[list[int], list[int]]] = {}
        due: set[str] = set()  # owners told now: asked, or told of a watched piece
        for p, owner in self._owner.items():
            if have[p]:
                if self._reported.get(p) != owner:
                    by_owner.setdefault(owner, ([], []))[0].append(p)
                    if p in watched:
                        due.add(owner)
            elif p in asking:
                by_owner.setdefault(owner, ([], []))[1].append(p)
                due.add(owner)
        # (the others hear of common pieces every ``interval_s``, and that this peer is
        # still here every ``keepalive_s``)
        for owner in list(by_owner):
            if owner not in due and now - self._last_report.get(owner, -1e9) < self.interval_s:
                del by_owner[owner]
        if self._seed(have):
            # a seed now: every supernode it reports to hears it at once, not at its
            # keepalive (a seed's pieces go to every asker, not through first
            # receivers: `pressrun.chord.directory.PieceDirectory.choose_uploader`)
            for owner in self._last_report:
                if owner not in self._told_done:
                    by_owner.setdefault(owner, ([], []))
                    due.add(owner)
        for owner, t in self._last_report.items():
            if owner not in by_owner and now - t >= self.keepalive_s:
                by_owner[owner] = ([], [])  # still here, with these totals
        self._bring_in = {p for p in self._bring_in if not have[p]}
        self._first = {p for p in self._first if not have[p]}
        self._given = {p for p in self._given if not have[p]}
        # The owners that may hand this peer pieces to bring in (it asks them about
        # pieces no connected peer holds) are asked one after the other, in random
        # order, each told what the ones before handed out (``bringing``): asked at
        # once, five supernodes each gave the same fast peer up to three (measured:
        # two peers of 20 brought in 12 pieces each, second holders 5.0 s at the
        # median against `stripes`' 1.8 s). The others are asked meanwhile.
        bringers = [o for o, (_, wants) in by_owner.items() if set(wants) - lonely]
        self.rng.shuffle(bringers)

        async def in_turn() -> list[bool]:
            return [await self._ask(o, *by_owner[o], up, down, now) for o in bringers]

        async def at_once() -> list[bool]:
            rest = [o for o in by_owner if o not in bringers]
            return list(
                await asyncio.gather(*(self._ask(o, *by_owner[o], up, down, now) for o in rest))
            )

        first, second = await asyncio.gather(in_turn(), at_once())
        if any(first) or any(second):
            self.policy.set_ring_answers(self._bring_in, self._first, self._given)
            self._on_answers()

    def _seed(self, have: Sequence[bool]) -> bool:
        # it holds every piece, and says so in its reports (``missing``: 0)
        return all(have) and self._missing() == 0

    def _may_ask(self, piece: int, lonely: bool, now: float) -> bool:
        return self._pacing.may_ask(piece, lonely, now)

    def _answered(self, piece: int, now: float, *, wait: bool) -> None:
        self._pacing.answered(piece, now, wait=wait)

    def _found_silent(self, sn: str, now: float) -> None:
        """``sn`` did not answer a report at ``now``: left out until it answers again
        or for ``failed_forget_s`` (`FAILED_FORGET_S`), at most `MAX_FAILED` kept."""
        self.stats.supernode_failures += 1
        if len(self.stats.failed_supernodes) < MAX_FAILED:
            self.stats.failed_supernodes.add(sn)
        self._failed.found(sn, now)

    def _silent(self, now: float) -> set[str]:
        return self._failed.at(now)

    def _guess_owners(self, pieces: list[int], now: float) -> None:
        # the Chord successor among the listed supernodes not found silent lately
        silent = self._silent(now)
        live = sorted(i for i, a in self._ids.items() if a not in silent)
        if not live:
            return
        for p in pieces:
            if p not in self._misplaced:
                self._owner[p] = self._ids[successor_of(live, self._keys[p])]

    async def _refresh_view(self, now: float) -> None:
        assert self._http is not None
        # (asked again after view_refresh_s whatever the answer; a tracker that does
        # not answer leaves the list as it was: the supernodes work without it)
        self._view_at = now
        async with self._http.get(f"{self.tracker_base}/v1/ring/{self.info_hash}") as r:
            doc = await r.json(content_type=None) if r.status == 200 else None
        keys = doc.get("piece_keys") if isinstance(doc, dict) else None
        if (
            not isinstance(doc, dict)
            or doc.get("num_pieces") != self.num_pieces
            or not isinstance(keys, list)
            or len(keys) != self.num_pieces
        ):
            # no ring (404), or one that is not this issue's: none until asked again
            self._supernodes, self._ids = [], {}
            return
        self._keys = [parse_id(k, "piece key") for k in keys]
        nodes = [parse_node(n) for n in doc.get("supernodes", [])]
        self._supernodes = [n.address for n in nodes]
        self._ids = {n.id: n.address for n in nodes}
        # forget owners the tracker no longer lists
        listed = set(self._supernodes)
        for owner in [o for o in self._last_report if o not in listed]:
            self._forget(owner)

    def _forget(self, owner: str) -> None:
        # its pieces are looked up again, and reported to their new owner
        self._owner = {p: o for p, o in self._owner.items() if o != owner}
        self._reported = {p: o for p, o in self._reported.items() if o != owner}
        self._last_report.pop(owner, None)

    async def _resolve(self, pieces: list[int], now: float) -> None:
        # any listed supernode can look keys up; two of them, in random order, so a
        # round stays short while the ring routes around a dead one (next round: others)
        order = self._supernodes[:]
        self.rng.shuffle(order)
        order = order[:_RESOLVE_TRIES]
        body = {
            "keys": [id_hex(self._keys[p]) for p in pieces],
            # (a supernode's kept answers naming these are looked up again)
            "failed": sorted(self._silent(now)),
        }
        for sn in order:
            # (a batch of lookups through the ring takes longer than one answer)
            doc = await self._post(sn, "lookup", body, timeout_s=self.lookup_timeout_s)
            owners = doc.get("owners") if doc else None
            if not isinstance(owners, dict):
                self._view_at = None  # read the ring's list again next round
                continue
            self._failed.answers(sn)
            self.stats.lookups += 1
            for p in pieces:
                node = owners.get(id_hex(self._keys[p]))
                if isinstance(node, dict):
                    self._owner[p] = parse_node(node).address
            return

    async def _ask(
        self, owner: str, haves: list[int], wants: list[int], up: int, down: int, now: float
    ) -> bool:
        body = {
            "peer_id": self.peer_id,
            "address": self.address,
            "have": haves,
            "want": wants,
            "uploaded": up,
            "downloaded": down,
            "bringing": len(self._bring_in),
            "brought": self._brought(),
            "upload_bps": self._upload_bps(),
            "download_bps": self._download_bps(),
            "bring_bps": self._bring_bps(),
        }
        # (None: it serves any asker, e.g. a sharing peer with slots to spare; said so
        # by leaving ``unchoked`` out, `pressrun.chord.directory`)
        if (unchoked := self._unchoked()) is not None:
            body["unchoked"] = list(unchoked)
        # (the order of the askers: the upload it left unused lately, its missing pieces)
        for name, said in (
            ("unused_upload_bps", self._unused_upload_bps),
            ("missing", self._missing),
        ):
            if (value := said()) is not None:
                body[name] = value
        doc = await self._post(owner, "pieces", body)
        if doc is None:
            # dead or unreachable: its pieces are looked up again next round
            self._found_silent(owner, now)
            self._forget(owner)
            self._view_at = None
            return False
        self._failed.answers(owner)
        self._last_report[owner] = now
        if doc.get("origins_held") is True:
            self.policy.hold_origins(now)  # (its fetch limit binds: no room of our own)
        if body.get("missing") == 0:
            self._told_done.add(owner)
        else:
            self._told_done.discard(owner)
        not_mine = {p for p in doc.get("not_mine", []) if isinstance(p, int)}
        for p in not_mine:
            self._owner.pop(p, None)
            self._misplaced.add(p)
        for p in haves:
            if p not in not_mine:
                self._reported[p] = owner
        for ans in doc.get("uploaders", []):
            if not isinstance(ans, dict):
                continue
            piece, addr = ans.get("piece"), ans.get("address")
            if not isinstance(piece, int) or not isinstance(addr, str):
                continue
            if ans.get("wait"):
                # nobody to upload it yet: ask again soon, not at once
                self.stats.waits += 1
                self._answered(piece, now, wait=True)
                self._given.discard(piece)
                continue
            self._answered(piece, now, wait=False)
            if ans.get("bring_in") is True:
                self._bring_in.add(piece)
                self.stats.bring_in += 1
                continue
            self._bring_in.discard(piece)
            if ans.get("first") is True:
                self._first.add(piece)
                self.stats.first += 1
            else:
                self._given.add(piece)
            self.stats.uploaders += 1
            if addr != self.address and addr not in self._connected:
                host, _, port = addr.rpartition(":")
                if port.isascii() and port.isdigit():
                    self._connected.add(addr)
                    self.stats.connects += 1
                    self._connect(host, int(port))
        return True

    async def _post(
        self, sn: str, route: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any] | None:
        assert self._http is not None
        self.stats.requests += 1
        return await post_json(
            self._http, f"http://{sn}/chord/v1/{route}", body, timeout_s=timeout_s or self.timeout_s
        )
