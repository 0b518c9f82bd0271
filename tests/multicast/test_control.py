"""Control-channel announcements: JSON codec, Ed25519 signing, the receiver's checks."""

from __future__ import annotations

import json
from dataclasses import replace

import nacl.signing
import pytest

from pressrun.multicast.codec import AnnouncementFormatError, decode_announcement
from pressrun.multicast.control import check_datagram, sign_announcement
from pressrun.multicast.core import AnnouncementGate
from pressrun.multicast.events import Announcement, AnnouncementVerdict, CarouselPlan, ChannelSpec

KEY = nacl.signing.SigningKey(bytes(range(32)))
PUBLIC = bytes(KEY.verify_key).hex()
PLAN = CarouselPlan(
    issue_id="weekly-2026-47",
    manifest_sha256="ab" * 32,
    size_bytes=5_000_000,
    toi=1,
    fec="raptorq",
    symbol_bytes=1400,
    source_symbols=3572,
    cycle_s=1.5,
    channels=(
        ChannelSpec("239.255.71.1", 40001, 7, 40e6, 3490.2),
        ChannelSpec("239.255.71.2", 40002, 7, 40e6, 3490.2),
    ),
)


def _ann(seq: int, issued: float = 1000.0) -> Announcement:
    return Announcement(PUBLIC, seq, issued, issued + 5.0, (PLAN,))


def test_round_trip() -> None:
    datagram = sign_announcement(_ann(3), KEY)
    ann, body, signature = decode_announcement(datagram)
    assert ann == _ann(3)
    counted = Announcement(PUBLIC, 4, 1000.0, 1005.0, (replace(PLAN, sent_packets=(7, 9)),))
    assert decode_announcement(sign_announcement(counted, KEY))[0] == counted
    KEY.verify_key.verify(body, signature)
    assert ann.plan_for("weekly-2026-47") == PLAN and ann.plan_for("other") is None


def test_only_the_named_key_signs() -> None:
    other = nacl.signing.SigningKey(bytes(32))
    with pytest.raises(ValueError, match="signed with"):
        sign_announcement(_ann(1), other)


def test_receiver_checks() -> None:
    gate = AnnouncementGate({PUBLIC})
    good = sign_announcement(_ann(5), KEY)
    ann, verdict, _ = check_datagram(good, gate, now_unix=1001.0)
    assert verdict is AnnouncementVerdict.ACCEPTED and ann is not None
    # replayed: the very same datagram again
    assert check_datagram(good, gate, now_unix=1001.5)[1] is AnnouncementVerdict.REPLAYED
    # stale: a newer sequence number but expired
    stale = sign_announcement(_ann(6, issued=900.0), KEY)
    assert check_datagram(stale, gate, now_unix=1001.5)[1] is AnnouncementVerdict.STALE
    # forged: a changed channel group under the old signature
    doc = json.loads(sign_announcement(_ann(7), KEY))
    doc["announcement"]["carousels"][0]["channels"][0]["group"] = "239.1.2.3"
    forged = json.dumps(doc).encode()
    assert check_datagram(forged, gate, now_unix=1001.5)[1] is AnnouncementVerdict.UNSIGNED
    # signed by a key that is not trusted
    other = nacl.signing.SigningKey(bytes(32))
    foreign = Announcement(bytes(other.verify_key).hex(), 8, 1000.0, 1005.0, (PLAN,))
    datagram = sign_announcement(foreign, other)
    assert check_datagram(datagram, gate, now_unix=1001.5)[1] is AnnouncementVerdict.UNTRUSTED
    # garbage
    ann, verdict, detail = check_datagram(b"\x00garbage", gate, now_unix=1001.5)
    assert ann is None and verdict is AnnouncementVerdict.MALFORMED and "not JSON" in detail
    # the good one after all that still moves on
    newer = sign_announcement(_ann(9), KEY)
    assert check_datagram(newer, gate, now_unix=1002.0)[1] is AnnouncementVerdict.ACCEPTED


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("carousels", 0, "channels", 0, "group"), "10.0.0.1", "not a multicast"),
        (("carousels", 0, "channels", 0, "port"), 70000, "out of range"),
        (("carousels", 0, "fec"), "rs28", "unknown fec"),
        (("carousels", 0, "issue_id"), "../etc", "invalid issue id"),
        (("carousels", 0, "manifest_sha256"), "zz", "64 hex"),
        (("carousels", 0, "channels"), [], "no channel"),
        (("seq",), 0, "at least 1"),
        (("format",), 2, "unknown announcement format"),
        (("carousels", 0, "sent_packets"), [1], "one count per channel"),
        (("carousels", 0, "sent_packets"), [1, -2], "list of counts"),
        (("expires_at",), "soon", "expires_at"),
    ],
)
def test_malformed_announcements_are_clear_errors(
    path: tuple[str | int, ...], value: object, message: str
) -> None:
    doc = json.loads(sign_announcement(_ann(1), KEY))
    target = doc["announcement"]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(AnnouncementFormatError, match=message):
        decode_announcement(json.dumps(doc).encode())


def test_a_round_is_cut_into_datagrams_that_each_fit() -> None:
    """130 carousels of 2 channels were one datagram of over 60,000 bytes (refused by
    the codec, and the announcement loop died on it); now a round is in parts."""
    from pressrun.multicast.codec import ANNOUNCEMENT_PART_BYTES, split_announcement

    plans = tuple(
        replace(PLAN, issue_id=f"weekly-{i:03d}", sent_packets=(7, 9)) for i in range(130)
    )
    ann = Announcement(PUBLIC, 10**12, 1000.0, 1005.0, plans)
    parts = split_announcement(ann, ANNOUNCEMENT_PART_BYTES)
    assert len(parts) > 1
    datagrams = [sign_announcement(p, KEY) for p in parts]
    assert max(len(d) for d in datagrams) <= ANNOUNCEMENT_PART_BYTES
    gate = AnnouncementGate({PUBLIC})
    seen = []
    for k, datagram in enumerate(datagrams):
        got, verdict, _ = check_datagram(datagram, gate, now_unix=1001.0)
        assert verdict is AnnouncementVerdict.ACCEPTED and got is not None
        assert (got.part, got.parts, got.round_seq) == (k, len(parts), 10**12)
        seen += got.carousels
    assert tuple(seen) == plans
    # a carousel bigger than a part goes alone; an empty round is one part
    big = replace(PLAN, channels=PLAN.channels * 8)
    alone = split_announcement(replace(ann, carousels=(big, PLAN)), 500)
    assert [len(p.carousels) for p in alone] == [1, 1]
    assert len(split_announcement(replace(ann, carousels=()), 1400)) == 1


def test_parts_out_of_range_are_malformed() -> None:
    doc = json.loads(sign_announcement(_ann(1), KEY))
    doc["announcement"]["part"] = 2
    doc["announcement"]["parts"] = 2
    with pytest.raises(AnnouncementFormatError, match="out of range"):
        decode_announcement(json.dumps(doc).encode())
