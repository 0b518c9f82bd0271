"""Chord messages <-> JSON: round trips, and garbage only ever raises CodecError."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.chord.codec import (
    MAX_RATE_BPS,
    CodecError,
    parse_pieces_query,
    parse_reply,
    parse_request,
    reply_json,
    request_json,
)
from pressrun.chord.events import (
    Ack,
    Closer,
    FindSuccessor,
    Found,
    GetState,
    Leaving,
    Notify,
    Ping,
    Reply,
    Request,
    State,
)
from pressrun.chord.ids import RING, NodeRef

A, B = NodeRef(5, "127.0.0.1:1"), NodeRef(RING - 1, "127.0.0.1:2")


def test_every_message_round_trips() -> None:
    for body in (FindSuccessor(7), GetState(), Notify(), Ping(), Leaving(A, (B,), {"x": [1]})):
        req = Request(3, A, body)
        assert parse_request(request_json(req)) == req
    for rbody in (Found(7, (A, B)), Closer(7, (B,), (A,)), State(None, (A,)), Ack()):
        rep = Reply(4, B, rbody)
        assert parse_reply(reply_json(rep)) == rep


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=45),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=20,
)


@settings(deadline=None, max_examples=50)
@given(json_values)
def test_garbage_raises_only_codec_errors(doc: object) -> None:
    for parse in (parse_request, parse_reply):
        with contextlib.suppress(CodecError):
            parse(doc)
    bad = request_json(Request(1, A, FindSuccessor(3)))
    for field, value in (("key", "zz"), ("rpc", -1), ("v", 2), ("type", "dance"), ("sender", {})):
        broken = dict(bad, **{field: value})
        try:
            parse_request(broken)
        except CodecError:
            continue
        raise AssertionError(f"{field}={value!r} was accepted")


def test_a_pieces_report_and_its_bounds() -> None:
    base = {"peer_id": "aa", "address": "127.0.0.1:5001", "have": [1], "want": [2, 2]}
    q = parse_pieces_query(
        {
            **base,
            "upload_bps": 10**6,
            "unused_upload_bps": 0,
            "download_bps": 5,
            "missing": 8,
            "bring_bps": 7,
        },
        num_pieces=8,
    )
    assert (q.want, q.unused_upload_bps, q.download_bps, q.missing) == ((2,), 0, 5, 8)
    assert q.bring_bps == 7
    # absent: not said (the supernode keeps what the peer said before)
    q = parse_pieces_query(base, num_pieces=8)
    assert q.unused_upload_bps is None and q.missing is None and q.unchoked is None
    assert q.download_bps == 0 and q.bring_bps == 0
    for name, bad in (
        ("bring_bps", -5),
        ("bring_bps", MAX_RATE_BPS + 1),
        ("unused_upload_bps", -1),
        ("unused_upload_bps", MAX_RATE_BPS + 1),
        ("unused_upload_bps", True),
        ("download_bps", 1.5),
        ("upload_bps", MAX_RATE_BPS + 1),
        ("missing", 9),
        ("missing", "3"),
        ("unchoked", ["x" * 65]),
    ):
        try:
            parse_pieces_query({**base, name: bad}, num_pieces=8)
        except CodecError as err:
            assert name in str(err)
        else:
            raise AssertionError(f"{name}={bad!r} accepted")


def test_a_report_may_name_every_leecher_of_a_large_swarm() -> None:
    # A peer with an upload slot free names every connected downloading peer it would
    # serve: at N = 80 on the loopback bench, up to 79. The bound was 64, and such a
    # report got 400, which the peer's ring client takes for a silent supernode.
    ids = [f"peer{i:03d}" for i in range(79)]
    base = {"peer_id": "aa", "address": "127.0.0.1:5001", "unchoked": ids}
    assert parse_pieces_query(base, num_pieces=8).unchoked == tuple(ids)
