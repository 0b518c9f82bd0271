"""The tracker's ring administration, pure (`RingAdmin` with an explicit ``now``): ids
kept across an expiry, the published piece count, per-address limits, nothing kept for
rings that are gone."""

from __future__ import annotations

import pytest

from pressrun.tracker.ring import RingAdmin, RingError

IH = "ab" * 20


def test_a_supernode_expired_and_back_gets_its_ring_id_again() -> None:
    # (issue 24, item 3: B came back at a new id it never adopted)
    admin = RingAdmin(ttl_s=30.0, expected_supernodes=3)
    ids = {
        a: admin.register(IH, a, 40, now=0.0).id for a in ("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1")
    }
    # A and C keep heartbeating, B is silent for 35 s
    for t in (10.0, 20.0, 30.0, 40.0):
        admin.register(IH, "10.0.0.1:1", 40, now=t)
        admin.register(IH, "10.0.0.3:1", 40, now=t)
    view = admin.view(IH, now=40.0)
    assert view is not None and {n.address for n in view.supernodes} == {"10.0.0.1:1", "10.0.0.3:1"}
    assert admin.register(IH, "10.0.0.2:1", 40, now=41.0).id == ids["10.0.0.2:1"]
    # all three silent past the TTL (the tracker down): each its own id again
    for a in ("10.0.0.3:1", "10.0.0.2:1", "10.0.0.1:1"):
        assert admin.register(IH, a, 40, now=200.0).id == ids[a]


def test_the_piece_count_is_the_published_one() -> None:
    admin = RingAdmin(published_pieces={IH: 16}.get)
    with pytest.raises(RingError, match="16 pieces"):
        admin.register(IH, "10.0.0.9:1", 1 << 20, now=0.0)
    assert admin.members(IH) is None  # the forged registration left nothing behind
    admin.register(IH, "10.0.0.1:1", 16, now=1.0)
    view = admin.view(IH, now=1.0)
    assert view is not None and view.num_pieces == 16 and len(view.piece_keys) == 16


def test_an_unpublished_count_is_fixed_only_while_the_ring_lives() -> None:
    # (an open tracker, or an issue allowed by hand: no torrent to read the count from)
    admin = RingAdmin(ttl_s=30.0)
    admin.register(IH, "10.0.0.9:1", 1000, now=0.0)
    with pytest.raises(RingError):
        admin.register(IH, "10.0.0.1:1", 16, now=10.0)
    # the first one silent past the TTL: the real count takes over
    assert admin.register(IH, "10.0.0.1:1", 16, now=40.0).address == "10.0.0.1:1"
    with pytest.raises(RingError, match="pieces"):
        admin.register(IH, "10.0.0.2:1", 70_000, now=41.0)  # (more than any issue has)


def test_one_address_takes_a_few_places_on_a_ring() -> None:
    admin = RingAdmin(max_per_host=8)
    taken = 0
    for port in range(1024):
        try:
            admin.register(IH, f"10.0.0.9:{10000 + port}", 40, now=0.0)
            taken += 1
        except RingError as err:
            assert "10.0.0.9" in str(err)
    assert taken == 8
    assert admin.register(IH, "10.0.0.1:7000", 40, now=0.0).address == "10.0.0.1:7000"


def test_rings_that_are_gone_are_forgotten() -> None:
    admin = RingAdmin(ttl_s=30.0, forget_ids_s=600.0)
    for i in range(200):
        admin.register(f"{i:040x}", "10.0.0.1:1", 4, now=0.0)
    admin.register(IH, "10.0.0.1:1", 4, now=1000.0)
    assert admin.issues() == [IH]
