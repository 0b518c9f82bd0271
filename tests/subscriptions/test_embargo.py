"""The embargo (issue 35): ``publish --encrypt --release-at`` and the service's refusals.

Real HTTP on 127.0.0.1, a real SQLite store, a real ``pressrun publish`` (through
``pressrun.cli.main``); the service's wall clock is a stepped fake, so "before" and
"after" the release are exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nacl.public
import nacl.signing
import pytest

from pressrun.cli import main
from pressrun.content.bundle import Bundle
from pressrun.content.codec import Manifest
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair, load_signing_key
from pressrun.content.release import (
    ReleaseError,
    ReleaseNotice,
    SignedRelease,
    parse_release_time,
    sign_release,
    unix_of,
)
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import (
    Embargoed,
    NotSubscribed,
    Revoked,
    SubscriptionError,
    SubscriptionsClient,
)
from pressrun.subscriptions.embargo import embargo_refusal
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "operator-secret-token"
RELEASE = "2027-01-15T06:00:00Z"
RELEASE_UNIX = unix_of(RELEASE)


@dataclass
class Clock:
    now: float = RELEASE_UNIX - 7200.0  # two hours before the release

    def __call__(self) -> float:
        return self.now


@dataclass
class Published:
    url: str
    http: aiohttp.ClientSession
    clock: Clock
    service: SubscriptionService
    manifest: Manifest
    reader: nacl.public.PrivateKey
    publisher: nacl.signing.SigningKey
    tmp: Path

    def client(self) -> SubscriptionsClient:
        return SubscriptionsClient(self.url, self.http, operator_token=TOKEN)

    async def wrap(self) -> bytes:
        enc = self.manifest.encryption
        assert enc is not None
        return await self.client().fetch_wrap(self.manifest.issue_id, enc.version, self.reader)

    def notice(self, at: str | None, sequence: int) -> SignedRelease:
        enc = self.manifest.encryption
        assert enc is not None
        n = ReleaseNotice(
            issue_id=self.manifest.issue_id,
            version=enc.version,
            release_at=at,
            revoked=at is None,
            sequence=sequence,
            publisher_key=self.manifest.publisher_key,
            signed_at="2027-01-15T03:00:00Z",
        )
        return sign_release(n, self.publisher)


@pytest.fixture
async def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Published]:
    """An issue published with --encrypt --release-at RELEASE for one real reader."""
    clock = Clock()
    service = SubscriptionService(
        SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN, clock=clock
    )
    port = await service.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    reader = nacl.public.PrivateKey.generate()
    service.store.add_subscriber(bytes(reader.public_key), "ada", "2027-01-15T00:00:00Z")
    key, _ = generate_keypair(tmp_path / "publisher.key")
    source = tmp_path / "weekly-03.pdf"
    source.write_bytes(os.urandom(100_000))
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", TOKEN)
    argv = ["publish", str(source), "--issue", "weekly-03", "--title", "Weekly 3"]
    argv += ["--key", str(key), "--content", str(tmp_path / "content"), "--encrypt"]
    argv += ["--subscriptions", url, "--release-at", "2027-01-15T07:00+01:00"]
    try:
        # publish runs its own loop on a thread: off this loop, which serves the service
        assert await asyncio.to_thread(main, argv) == 0
        manifest = Bundle.load(tmp_path / "content" / "weekly-03").manifest
        async with aiohttp.ClientSession() as http:
            yield Published(
                url, http, clock, service, manifest, reader, load_signing_key(key), tmp_path
            )
    finally:
        await service.close()


async def test_release_time_is_signed_into_the_manifest(published: Published) -> None:
    enc = published.manifest.encryption
    assert enc is not None and enc.release_at == RELEASE  # +01:00 became UTC
    # it is under the manifest's signature: changed, the manifest no longer verifies
    raw = (published.tmp / "content" / "weekly-03" / "manifest.json").read_bytes()
    assert b'"release_at": "2027-01-15T06:00:00Z"' in raw
    tampered = raw.replace(b"2027-01-15T06:00:00Z", b"2027-01-15T05:00:00Z")
    from pressrun.content.manifest import ManifestError, SignedManifest

    with pytest.raises(ManifestError, match="signature"):
        SignedManifest.from_json_bytes(tampered).verify()


async def test_a_wrap_before_the_release_is_refused_with_the_release_time(
    published: Published,
) -> None:
    with pytest.raises(Embargoed) as caught:
        await published.wrap()
    assert caught.value.release_at == RELEASE
    assert caught.value.retry_after_s == pytest.approx(7200.0)
    assert caught.value.release is not None  # the signed notice, checkable by the reader
    assert caught.value.release.verify().release_at == RELEASE
    # the HTTP answer itself (docs/protocols.md): 403, code embargoed, Retry-After
    enc = published.manifest.encryption
    assert enc is not None
    token = await _token(published)
    async with published.http.get(
        f"{published.url}/v1/issues/weekly-03/versions/{enc.version}/wrap",
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:
        assert resp.status == 403
        assert resp.headers["Retry-After"] == "7200"
        doc = await resp.json()
    assert doc["code"] == "embargoed" and doc["release_at"] == RELEASE
    # one second before: still refused
    published.clock.now = RELEASE_UNIX - 1
    with pytest.raises(Embargoed):
        await published.wrap()


async def test_a_wrap_from_the_release_is_handed_out(published: Published) -> None:
    published.clock.now = RELEASE_UNIX
    wrap = await published.wrap()
    enc = published.manifest.encryption
    assert enc is not None
    assert len(open_wrap(wrap, published.reader, enc.key_check)) == 32


async def test_wraps_handed_out_are_timed_for_the_release_minute(published: Published) -> None:
    """/metrics' pressrun_subscriptions_wrap_seconds (the emulation's release-minute
    latency, issue 35): each wrap handed out, no refusal."""

    async def count() -> float:
        async with published.http.get(f"{published.url}/metrics") as resp:
            text = await resp.text()
        line = [
            ln
            for ln in text.splitlines()
            if ln.startswith("pressrun_subscriptions_wrap_seconds_count")
        ]
        return float(line[0].split()[-1])

    with pytest.raises(Embargoed):
        await published.wrap()
    assert await count() == 0
    published.clock.now = RELEASE_UNIX
    await published.wrap()
    await published.wrap()
    assert await count() == 2


async def test_a_moved_release_time_is_honoured(published: Published) -> None:
    client = published.client()
    # earlier: from 06:00 to 05:00, asked at 05:30 -> handed out
    await client.put_release(published.notice("2027-01-15T05:00:00Z", 2))
    published.clock.now = RELEASE_UNIX - 1800
    assert len(await published.wrap()) == 80
    # later: to 08:00, asked at 07:00 -> refused again, with the new time
    await client.put_release(published.notice("2027-01-15T08:00:00Z", 3))
    published.clock.now = RELEASE_UNIX + 3600
    with pytest.raises(Embargoed) as caught:
        await published.wrap()
    assert caught.value.release_at == "2027-01-15T08:00:00Z"
    assert caught.value.retry_after_s == pytest.approx(3600.0)
    # an old notice (replayed) does not move it back; nor does another publisher's key
    with pytest.raises(SubscriptionError, match="higher"):
        await client.put_release(published.notice("2027-01-15T05:00:00Z", 2))
    stranger = nacl.signing.SigningKey.generate()
    n = published.notice("2027-01-15T05:00:00Z", 9).notice
    forged = dataclasses.replace(n, publisher_key=bytes(stranger.verify_key).hex())
    with pytest.raises(SubscriptionError, match="another publisher key"):
        await client.put_release(sign_release(forged, stranger))
    # a notice whose signature does not match is refused before anything is stored
    bad = SignedRelease(published.notice("2027-01-15T05:00:00Z", 10).notice, b"\x01" * 64)
    with pytest.raises(SubscriptionError, match="signature"):
        await client.put_release(bad)
    with pytest.raises(Embargoed):
        await published.wrap()


async def test_revoked_release_hands_out_nothing(published: Published) -> None:
    await published.client().put_release(published.notice(None, 2))
    published.clock.now = RELEASE_UNIX + 86400
    with pytest.raises(Revoked):
        await published.wrap()
    # a later move brings it back
    await published.client().put_release(published.notice("2027-01-16T06:00:00Z", 3))
    published.clock.now = RELEASE_UNIX + 86400
    assert len(await published.wrap()) == 80


async def test_a_removed_subscriber_gets_none(published: Published) -> None:
    # it may hold the ciphertext already (pre-positioned); removed before the release,
    # it gets no wrap at the release nor after
    await published.client().remove_subscriber(bytes(published.reader.public_key))
    for now in (RELEASE_UNIX - 60, RELEASE_UNIX, RELEASE_UNIX + 3600):
        published.clock.now = now
        with pytest.raises(NotSubscribed):
            await published.wrap()


async def test_a_second_instance_on_the_same_database_sees_a_move(published: Published) -> None:
    """Two service processes may share one SQLite file (more wraps per second): a move
    through one is honoured by the other at once (PRAGMA data_version)."""
    other = SubscriptionService(
        SubscriptionStore(published.tmp / "subs.db"), operator_token=TOKEN, clock=published.clock
    )
    port = await other.start("127.0.0.1", 0)
    try:
        enc = published.manifest.encryption
        assert enc is not None
        second = SubscriptionsClient(f"http://127.0.0.1:{port}", published.http)
        published.clock.now = RELEASE_UNIX - 600
        with pytest.raises(Embargoed):
            await second.fetch_wrap("weekly-03", enc.version, published.reader)
        await published.client().put_release(published.notice("2027-01-15T05:00:00Z", 2))
        assert len(await second.fetch_wrap("weekly-03", enc.version, published.reader)) == 80
    finally:
        await other.close()


async def test_release_command_line(published: Published) -> None:
    key = str(published.tmp / "publisher.key")
    enc = published.manifest.encryption
    assert enc is not None
    common = ["weekly-03", "--issue-version", str(enc.version), "--service", published.url]
    move = ["release", "move", *common, "--key", key, "--at", "2027-01-15T05:30:00Z"]
    assert await asyncio.to_thread(main, move) == 0
    published.clock.now = RELEASE_UNIX - 1200  # 05:40
    assert len(await published.wrap()) == 80
    assert await asyncio.to_thread(main, ["release", "revoke", *common, "--key", key]) == 0
    with pytest.raises(Revoked):
        await published.wrap()
    assert await asyncio.to_thread(main, ["release", "show", *common]) == 0


def test_embargo_rule_with_an_explicit_clock() -> None:
    signer = nacl.signing.SigningKey.generate()
    notice = ReleaseNotice(
        issue_id="weekly-03",
        version=1,
        release_at=RELEASE,
        revoked=False,
        sequence=1,
        publisher_key=bytes(signer.verify_key).hex(),
        signed_at="2027-01-15T03:00:00Z",
    )
    release = sign_release(notice, signer)
    assert embargo_refusal(None, now_unix=0) is None
    before = embargo_refusal(release, now_unix=RELEASE_UNIX - 0.25)
    assert before is not None and before.status == 403 and before.code == "embargoed"
    assert before.extra["release_at"] == RELEASE and before.headers["Retry-After"] == "1"
    assert embargo_refusal(release, now_unix=RELEASE_UNIX) is None
    gone = embargo_refusal(
        sign_release(dataclasses.replace(notice, release_at=None, revoked=True), signer),
        now_unix=RELEASE_UNIX + 1,
    )
    assert gone is not None and gone.status == 410 and gone.code == "revoked"


def test_release_times_people_write() -> None:
    now = unix_of("2027-01-15T04:00:00Z")
    assert parse_release_time("2027-01-15T06:00:00Z", now_unix=now) == RELEASE
    assert parse_release_time("2027-01-15T07:00+01:00", now_unix=now) == RELEASE
    assert parse_release_time("2027-01-15 01:00-05:00", now_unix=now) == RELEASE
    assert parse_release_time("+2h", now_unix=now) == RELEASE
    assert parse_release_time("+120m", now_unix=now) == RELEASE
    for bad in ("2027-01-15T06:00:00", "tomorrow", "+2x", "2027-02-30T06:00:00Z"):
        with pytest.raises(ReleaseError):
            parse_release_time(bad, now_unix=now)


async def _token(p: Published) -> str:
    async with p.http.post(
        f"{p.url}/v1/challenge", json={"subscriber": bytes(p.reader.public_key).hex()}
    ) as resp:
        sealed = bytes.fromhex((await resp.json())["sealed_token"])
    return nacl.public.SealedBox(p.reader).decrypt(sealed).hex()
