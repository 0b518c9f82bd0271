"""A desktop announces one client session on two trackers (HTTP and WebSocket, one
BEP 7 key) whose reports arrive out of order: its totals are the bytes it moved.

In the readers' crowd bench of 28 Nov (run 20, 9a83fa0) desktops that sent about
21 MB were recorded at 109-479 MB: a report with a counter below the one counted was
read as a new session, and its whole counters were added again.
"""

from __future__ import annotations

from pressrun.tracker.accounting import accumulate
from pressrun.tracker.events import AnnounceEvent, AnnounceRequest, PeerRecord

IH = bytes(range(20))
PEER = b"-PR0100-aaaaaaaaaaaa"
KEY = "35363046313734"  # the hex of the key's bytes, as both codecs keep it


def report(
    up: int, down: int, *, event: AnnounceEvent = AnnounceEvent.NONE, key: str | None = KEY
) -> AnnounceRequest:
    return AnnounceRequest(
        info_hash=IH,
        peer_id=PEER,
        port=7001,
        uploaded=up,
        downloaded=down,
        left=0,
        event=event,
        key=key,
    )


def totals(*reports: AnnounceRequest) -> tuple[int, int]:
    record: PeerRecord | None = None
    for r in reports:
        record = accumulate(record, r, ip="127.0.0.1", now=0.0)
    assert record is not None
    return record.uploaded_total, record.downloaded_total


def test_the_other_channels_late_started_adds_nothing() -> None:
    # HTTP: started, then 1,000 / 3,000; the WebSocket's started (zero counters)
    # arrives after it, then HTTP again at 2,000 / 5,000
    assert totals(
        report(0, 0, event=AnnounceEvent.STARTED),
        report(1000, 3000),
        report(0, 0, event=AnnounceEvent.STARTED),
        report(2000, 5000),
    ) == (2000, 5000)  # before: 4,000 / 10,000 (the late started opened a session)


def test_alternating_channels_one_behind_count_each_byte_once() -> None:
    # the WebSocket's reports lag the HTTP ones by one interval, turn about
    sent = [(1000 * i, 2000 * i) for i in range(1, 9)]
    reports = []
    for i, (up, down) in enumerate(sent):
        reports.append(report(up, down))
        if i:
            reports.append(report(*sent[i - 1]))
    assert totals(*reports) == sent[-1]  # before: about 8 times as much


def test_a_restarted_client_still_counts_its_new_session() -> None:
    # a new process has a new key: its counters from zero are all new bytes
    assert totals(
        report(5000, 5000),
        report(1000, 2000, event=AnnounceEvent.STARTED, key="6e6577"),
    ) == (6000, 7000)


def test_without_a_key_lower_counters_are_still_a_new_session() -> None:
    assert totals(report(5000, 5000, key=None), report(1000, 2000, key=None)) == (6000, 7000)
