"""The `chord` uploader policy: the ring's bring-in pieces first, `stripes` until then."""

from __future__ import annotations

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.status import UploadUse
from pressrun.peer.stripes_policy import StripesPolicy
from pressrun.peer.uploader import MAX_PRIORITY, MIN_PRIORITY, SwarmView, make_uploader_policy


def view(have: tuple[bool, ...], leechers: tuple[str, ...] = ("bb",)) -> SwarmView:
    return SwarmView(
        peer_id="aa", info_hash="12" * 20, have=have, connected_peers=2, leecher_ids=leechers
    )


def test_registered_waits_for_the_ring_then_stripes() -> None:
    policy = make_uploader_policy("chord")
    assert isinstance(policy, ChordPolicy) and policy.fetches_owed_pieces
    v = view((False,) * 8)
    # the ring's first answer is coming: nothing owed (every piece the lowest), every
    # piece nobody connected holds is the ring's to hand out
    waiting = policy.plan(v, now=10.0)
    assert waiting is not None and set(waiting.piece_priorities) == {MIN_PRIORITY}
    assert policy.waiting_on([3, 4]) == [3, 4]
    # no answer within ring_wait_s: `stripes`
    assert policy.plan(v, now=10.0 + policy.ring_wait_s) == StripesPolicy().plan(v, now=0.0)
    assert policy.waiting_on([3, 4]) == []
    # no ring at all (the tracker lists none): `stripes` at once
    other = ChordPolicy()
    other.ring_lost()
    assert other.plan(v, now=0.0) == StripesPolicy().plan(v, now=0.0)


def test_bring_in_pieces_get_the_top_priority_the_rest_the_lowest() -> None:
    policy = ChordPolicy()
    policy.set_ring_answers({1, 5})
    have = (False, False, True, False, False, True, False, False)
    plan = policy.plan(view(have), now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (
        MIN_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, MIN_PRIORITY,
        MIN_PRIORITY, MIN_PRIORITY, MIN_PRIORITY, MIN_PRIORITY,
    )  # fmt: skip
    # (piece 5 is held already: nothing to bring in)
    # alone too: its pieces to bring in are fetched at once
    assert policy.plan(view(have, leechers=()), now=1.0) == plan
    policy.ring_lost()
    assert not policy.ring_ready and policy.bring_in == frozenset()


def test_pieces_nobody_connected_holds_wait_for_the_ring_once_it_answered() -> None:
    # (so the peer never fetches them from the origins on its own: the ring says who)
    policy = ChordPolicy()
    policy.ring_lost()
    assert policy.waiting_on([3, 4]) == []  # no ring: `stripes`' rules
    policy.set_ring_answers({1})
    assert policy.waiting_on([3, 4]) == [3, 4]


def test_a_piece_one_connected_peer_holds_goes_to_its_first_receivers_only() -> None:
    # a tree, not a star: the ring named this peer a first receiver of piece 1; piece 2
    # (one holder too) waits for a second holder; piece 3 has two; piece 4 none yet but
    # named (its bringer is fetching it: not top priority, or it would be owed)
    policy = ChordPolicy()
    policy.set_ring_answers({0}, first={1, 4})
    have = (False, False, False, False, False, True)
    v = SwarmView(
        peer_id="aa",
        info_hash="12" * 20,
        have=have,
        connected_peers=3,
        holders=(0, 1, 1, 2, 0, 1),
    )
    plan = policy.plan(v, now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (MAX_PRIORITY, MAX_PRIORITY, 0, MIN_PRIORITY, MIN_PRIORITY, 1)
    # never every missing piece on hold: a torrent with nothing wanted is "finished"
    # and finished peers drop their connections
    only_lonely = (True, False, False, True, False, True)
    plan = policy.plan(
        SwarmView(
            peer_id="aa",
            info_hash="12" * 20,
            have=only_lonely,
            connected_peers=3,
            holders=(0, 1, 1, 2, 0, 1),
        ),
        now=1.0,
    )
    assert plan is not None and plan.piece_priorities[2] == MIN_PRIORITY
    # a piece is held off for at most hold_s (4 s) after it became lonely
    assert policy.plan(v, now=4.9).piece_priorities[2] == 0  # type: ignore[union-attr]
    assert policy.plan(v, now=5.1).piece_priorities[2] == MIN_PRIORITY  # type: ignore[union-attr]


def test_the_upload_left_unused_over_the_last_two_seconds() -> None:
    use = UploadUse(window_s=2.0)
    assert use.unused_bps(1_000_000) == 1_000_000  # a newcomer: all of it
    use.add(0.0, 0)
    use.add(0.5, 100_000)
    assert use.unused_bps(1_000_000) == 1_000_000  # (under half a window: all of it)
    use.add(1.0, 600_000)  # 0.6 MB/s
    assert use.unused_bps(1_000_000) == 400_000
    for t in (1.5, 2.0, 2.5, 3.0):
        use.add(t, 600_000 + int((t - 1.0) * 1_000_000))  # then at full rate
    assert use.unused_bps(1_000_000) == 0
    for t in (3.5, 4.0, 4.5, 5.0):
        use.add(t, 2_600_000)  # then nothing: the window forgets the busy seconds
    assert use.unused_bps(1_000_000) == 1_000_000


def test_a_piece_the_ring_gave_an_uploader_for_is_not_held_off() -> None:
    # Piece 2 has one connected holder, and the ring answered it with an uploader
    # outside the first receivers: it knows two holders or more (the tree has grown
    # already, maybe at peers this one is not connected to yet). Before, the peer held
    # it off (priority 0) for up to hold_s anyway, until a second holder showed among
    # its own connections; piece 3, which the ring said nothing of, still waits.
    policy = ChordPolicy()
    policy.set_ring_answers({0}, first={1}, given={2})
    v = SwarmView(
        peer_id="aa",
        info_hash="12" * 20,
        have=(False,) * 6,
        connected_peers=3,
        holders=(0, 1, 1, 1, 2, 2),
    )
    plan = policy.plan(v, now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (
        MAX_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, 0, MIN_PRIORITY, MIN_PRIORITY,
    )  # fmt: skip
    policy.ring_lost()
    assert policy.given == frozenset()
