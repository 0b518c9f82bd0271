"""One announce's effect on its peer's record: the record's address family and the
session's counters folded into the totals. Pure: functions of the record before and
the announce, used by the tracker core (`pressrun.tracker.core`) and the WebSocket
tracker's relay, which accounts a browser's bytes the same way.

Accounting (``accumulate``): announce counters are cumulative per client session and
restart at zero when the client restarts. The tracker keeps the last counters of the
current session and adds only what grew. An announce continues the stored session
when the record exists, neither counter went backwards, and either both sides have a
BEP 7 ``key`` and it is the same, or (no key) the previous session did not end with
``stopped`` and this is not a ``started``. Otherwise it opens a new session whose
counters began at zero, so its whole counters are new bytes. Counters going
backwards mean a new session, so a restarted client is never subtracted and a
repeated announce is never added twice, with one exception (``lags_session``): with
the stored session's own key they are an older report of that session, which adds
nothing and leaves the stored counters at the highest seen. libtorrent sends one key
on its HTTP and WebSocket trackers, and the two channels' announces arrive out of
order (each on its own interval; a ``started`` on the WebSocket with zero counters
after the HTTP tracker has heard thousands of bytes): read as new sessions, each
such report added the session's whole counters again, and in the readers' crowd
bench of 28 Nov (run 20, 9a83fa0) desktops that sent about 21 MB were recorded at
109-479 MB and one was refused its claim.
"""

from __future__ import annotations

from pressrun.tracker.events import (
    AddressFamily,
    AnnounceEvent,
    AnnounceRequest,
    LeaveRule,
    PeerRecord,
)


def family_of(ip: str) -> AddressFamily:
    """IPv4 or IPv6, for an address already validated."""
    return AddressFamily.IPV6 if ":" in ip else AddressFamily.IPV4


def lags_session(prev: PeerRecord | None, req: AnnounceRequest) -> bool:
    """Whether ``req`` is an older report of ``prev``'s client session: the same BEP 7
    key, and a counter below the one already counted (module doc)."""
    if prev is None or req.key is None or req.key != prev.session_key:
        return False
    return req.uploaded < prev.session_uploaded or req.downloaded < prev.session_downloaded


def continues_session(prev: PeerRecord | None, req: AnnounceRequest) -> bool:
    """Whether ``req`` carries the counters of ``prev``'s client session (module doc)."""
    if prev is None:
        return False
    if req.uploaded < prev.session_uploaded or req.downloaded < prev.session_downloaded:
        return False
    if req.key is not None and prev.session_key is not None:
        return req.key == prev.session_key
    return not prev.session_stopped and req.event is not AnnounceEvent.STARTED


def straggles(prev: PeerRecord | None, req: AnnounceRequest) -> bool:
    """Whether ``req`` is a plain announce of a client session whose ``stopped`` the
    tracker has already counted: one sent before the ``stopped`` that arrived after it
    (a peer leaving re-announces with its rule, then pauses: under load the two cross).
    A session that starts again says ``started``; a plain announce with the key of the
    session that stopped, and counters no higher than at its ``stopped``, is answered
    and changes nothing: it would otherwise bring back a peer that has left, without its
    rule. (Without a key a plain announce still brings a peer back, as before.)"""
    if prev is None or not prev.session_stopped or req.event is not AnnounceEvent.NONE:
        return False
    if req.key is None or req.key != prev.session_key:
        return False
    return req.uploaded <= prev.session_uploaded and req.downloaded <= prev.session_downloaded


def accumulate(prev: PeerRecord | None, req: AnnounceRequest, *, ip: str, now: float) -> PeerRecord:
    """The peer's record after ``req``: totals grown by the new bytes only."""
    family = family_of(ip)
    stopped = req.event is AnnounceEvent.STOPPED
    if prev is None:
        base_up = base_down = total_up = total_down = 0
        completed, first_seen, version = 0, now, 0
        was_leecher = True
    else:
        total_up, total_down = prev.uploaded_total, prev.downloaded_total
        if continues_session(prev, req) or lags_session(prev, req):
            base_up, base_down = prev.session_uploaded, prev.session_downloaded
        else:
            base_up = base_down = 0
        completed, first_seen, version = prev.completed_count, prev.first_seen, prev.version
        # A repeated `completed` (a retried announce) must not count twice.
        was_leecher = prev.left > 0 or not prev.active
    if req.event is AnnounceEvent.COMPLETED and was_leecher:
        completed += 1
    return PeerRecord(
        info_hash=req.info_hash,
        peer_id=req.peer_id,
        family=family,
        ip=ip,
        port=req.port,
        left=req.left,
        # an older report (lags_session) adds nothing and keeps the highest counters;
        # otherwise req's counters are at least the base
        uploaded_total=total_up + max(0, req.uploaded - base_up),
        downloaded_total=total_down + max(0, req.downloaded - base_down),
        session_uploaded=max(req.uploaded, base_up),
        session_downloaded=max(req.downloaded, base_down),
        session_key=req.key,
        active=not stopped,
        session_stopped=stopped,
        completed_count=completed,
        first_seen=first_seen,
        last_seen=now,
        leave_rule=(req.leave_rule or LeaveRule.UNSPECIFIED) if stopped else None,
        left_at=now if stopped else None,
        version=version + 1,
    )
