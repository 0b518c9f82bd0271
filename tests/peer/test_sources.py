"""`classify_missing`: the pieces a peer lacks, by who could give them."""

from pressrun.peer.sources import MissingPieces, classify_missing
from pressrun.peer.uploader import MAX_PRIORITY


def test_web_seeds_do_not_count_as_holders() -> None:
    # 2 web-seed connections: availability 2 means only the origins hold the piece
    have = [True, False, False, False, False]
    avail = [3, 3, 2, 2, 2]
    plan = [1, 1, MAX_PRIORITY, 1, MAX_PRIORITY]
    assert classify_missing(have, avail, 2, plan) == MissingPieces(
        tradable=1, owed=(2, 4), absent=(3,)
    )


def test_without_a_plan_nothing_is_owed() -> None:
    assert classify_missing([False, False], [0, 1], 0, None) == MissingPieces(
        tradable=1, owed=(), absent=(0,)
    )


def test_a_complete_copy_lacks_nothing() -> None:
    assert classify_missing([True] * 3, [0, 0, 0], 1, None) == MissingPieces(0, (), ())
