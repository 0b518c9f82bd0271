"""A prefetch reader's ``download_s`` is the seconds to its opened copy in the library,
not its leave of the prefetchers' swarm after: here the tracker never answers the
``stopped`` announce the leave sends, so leaving waits for libtorrent's bound on it
(``stop_tracker_timeout``, 2 s; raised to `STOP_TRACKER_TIMEOUT_S` here, so that the
leave is plainly longer than the decryption and the install beside it on a loaded
host), and that wait is in ``seconds`` and ``leave_s``, not in ``download_s``. Before
this change the plaintext was installed only once the swarm was left, and
``download_s`` (then ``seconds``) counted the leave (2.0 s of 10.1 with the bound at 2 s).

One prefetcher on 127.0.0.1, in the bed of tests/clients/test_prefetch_swarm.py (two
origin processes, the balancer, pressrun's tracker, the subscription service); the
tracker's announce route holds a ``stopped`` announce until the client hangs up, and
asks for announces a minute apart: libtorrent sends no ``stopped`` when the torrent is
paused while a regular announce is in flight, which the bed's 1 s interval made 1 run
in 17 here (its leave then took 2 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

pytest.importorskip("libtorrent")

from clients.test_prefetch_swarm import FAST, ISSUE, LEAD_S, RATE, Bed, bed  # noqa: F401
from pressrun.clients.cli import result_document
from pressrun.clients.prefetch import prefetch_issue
from pressrun.tracker.announce_http import AnnounceRoutes

#: libtorrent's bound on the ``stopped`` announces when its session ends, here (s)
STOP_TRACKER_TIMEOUT_S = 6


@pytest.fixture(autouse=True)
def unanswered_stops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The tracker (started after this, by `bed`) never answers a ``stopped``
    announce: it holds it until the client hangs up; the events held are listed.
    The prefetchers' sessions wait `STOP_TRACKER_TIMEOUT_S` for those answers."""
    import clients.test_prefetch_swarm
    import pressrun.peer.session
    from pressrun.tracker.config import TrackerConfig

    held: list[str] = []
    answer = AnnounceRoutes.announce
    settings = pressrun.peer.session.session_settings

    def patient(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**settings(*args, **kwargs), "stop_tracker_timeout": STOP_TRACKER_TIMEOUT_S}

    def minute_apart(**kwargs: Any) -> TrackerConfig:
        return TrackerConfig(**{**kwargs, "interval_s": 60, "min_interval_s": 60})

    async def announce(self: AnnounceRoutes, request: web.Request) -> web.Response:
        if request.query.get("event") != "stopped":
            return await answer(self, request)
        held.append(request.query.get("peer_id", "?"))
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        return web.Response(status=204)  # to nobody: the client has gone

    monkeypatch.setattr(AnnounceRoutes, "announce", announce)
    monkeypatch.setattr(pressrun.peer.session, "session_settings", patient)
    monkeypatch.setattr(clients.test_prefetch_swarm, "TrackerConfig", minute_apart)
    yield held


async def test_a_prefetch_readers_slow_leave_is_not_in_download_s(
    bed: Bed,  # noqa: F811
    tmp_path: Path,
    unanswered_stops: list[str],
) -> None:
    bed.pace(RATE, min_rate=50_000, renew_s=2.0)
    result = await asyncio.wait_for(
        prefetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=tmp_path / "library",
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.readers[0],
            client_id="alone",
            listen_interfaces="127.0.0.1:0",
        ),
        LEAD_S + 30,
    )
    assert result.mode == "prefetch" and result.swarm_note is None, result.swarm_note
    assert result.path.read_bytes() == bed.data
    # the leave sent its stopped announce, which the tracker held unanswered ...
    assert unanswered_stops, ("no stopped announce reached the tracker", result)
    # ... and waited libtorrent's bound for it: in leave_s, its steps splitting it
    assert result.leave_steps is not None, result
    assert result.leave_s >= STOP_TRACKER_TIMEOUT_S - 0.2, (result.leave_s, result.leave_steps)
    assert result.leave_s >= sum(result.leave_steps.values()) - 0.01, result.leave_steps
    # download_s is the copy opened in the library, before the leave ended (the
    # decryption and the install ran beside the leave: up to half of it, here)
    assert result.ready_s is not None and result.download_s == result.ready_s
    assert result.download_s < result.seconds - STOP_TRACKER_TIMEOUT_S / 2
    # and the copy was opened no earlier than the release
    assert result.download_s >= LEAD_S - 2.0
    doc = result_document(result)
    assert doc["download_s"] == result.ready_s and doc["leave_s"] == result.leave_s
    print(
        f"opened at {result.download_s:.2f} s, left in {result.leave_s:.2f} s "
        f"{result.leave_steps}, all {result.seconds:.2f} s"
    )
