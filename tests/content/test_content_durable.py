"""What survives a crash or a full disk on the publisher's side: key pairs whole and as
a pair, issue versions that never go back, and what an interrupted publish left."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import nacl.public
import nacl.signing
import pytest
from published_bundle import PIECE, Published, make_issue

from pressrun.content.bundle import Bundle, verify_issue
from pressrun.content.keys import (
    KeyFileError,
    generate_keypair,
    load_signing_key,
)
from pressrun.content.publish import PublishError, publish


class Directory:
    """An in-memory subscriber directory that records every version stored."""

    url = "http://127.0.0.1:8090"

    def __init__(self) -> None:
        self.reader = nacl.public.PrivateKey.generate()
        self.stored: list[int] = []

    def subscriber_keys(self) -> list[bytes]:
        return [bytes(self.reader.public_key)]

    def store_wraps(
        self, issue_id: str, version: int, wraps: Mapping[bytes, bytes], release: object = None
    ) -> list[bytes]:
        self.stored.append(version)
        return []


def test_keys_new_on_a_full_disk_leaves_no_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(KeyFileError, match="No space left on device"):
        generate_keypair(tmp_path / "publisher.key")
    monkeypatch.setattr(os, "write", real)
    assert list(tmp_path.iterdir()) == []  # no 0-byte secret key that blocks the next run
    secret, _ = generate_keypair(tmp_path / "publisher.key")
    assert load_signing_key(secret)


def test_a_full_disk_between_the_two_key_files_finishes_the_pair_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_secret, old_public = generate_keypair(tmp_path / "publisher.key")
    old = old_public.read_text()
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).endswith(".pub"):  # the secret key is in, its .pub cannot be
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyFileError, match="the new pair is kept in"):
        generate_keypair(tmp_path / "publisher.key", force=True)
    monkeypatch.setattr(os, "replace", real)
    assert (tmp_path / ".publisher.key.new-pair").exists()  # keys.pending_path_for
    # the next user of the key finishes the pair: never the new secret with the old .pub
    key = load_signing_key(old_secret)
    new = old_public.read_text()
    assert new != old and bytes.fromhex(new.strip()) == bytes(key.verify_key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["publisher.key", "publisher.key.pub"]


def test_a_mismatched_pair_is_refused(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "a.key")
    _, other = generate_keypair(tmp_path / "b.key")
    shutil.copy(other, public)
    with pytest.raises(KeyFileError, match=r"is not the public key of .*a mismatched pair"):
        load_signing_key(secret)
    with pytest.raises(PublishError, match="mismatched pair"):
        source = tmp_path / "x.pdf"
        make_issue(source, 1000)
        publish(source, issue_id="x", title="x", key_path=secret, content_dir=tmp_path / "c")


def test_versions_never_go_back_when_the_bundle_is_lost(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    source = tmp_path / "weekly-49.pdf"
    make_issue(source, 100_003)
    d = Directory()

    def again(**kw: object) -> Bundle:
        bundle = publish(
            source,
            issue_id="weekly-49",
            title="Weekly 49",
            key_path=keypair[0],
            content_dir=tmp_path / "content",
            piece_size=PIECE,
            encrypt_for=d,
            force=True,
            **kw,  # type: ignore[arg-type]
        )
        return Bundle.load(bundle)

    assert again().manifest.encryption.version == 1  # type: ignore[union-attr]
    # the bundle folder is lost (what a killed `publish --force` of old left): the
    # version it had is still used, so its wraps are never overwritten with a new key
    shutil.rmtree(tmp_path / "content" / "weekly-49")
    assert again().manifest.encryption.version == 2  # type: ignore[union-attr]
    with pytest.raises(PublishError, match="version 2 of weekly-49 is not above the last"):
        again(version=2)
    assert again(version=7).manifest.encryption.version == 7  # type: ignore[union-attr]
    assert d.stored == [1, 2, 7]


def test_publish_puts_back_a_bundle_that_a_crash_left_aside(
    published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    # what pressrun before issue 27 left when killed between its two renames
    aside = published.content / ".weekly-2026-47.replaced-abc"
    published.bundle.rename(aside)
    unfinished = published.content / ".weekly-2026-47.publishing-def"
    unfinished.mkdir()
    (unfinished / "weekly-2026-47.pdf").write_bytes(b"half")
    other = published.source.with_name("monthly-1.pdf")
    make_issue(other, 20_000)
    with caplog.at_level(logging.WARNING, logger="pressrun.content.publish"):
        publish(
            other,
            issue_id="monthly-1",
            title="Monthly 1",
            key_path=published.key,
            content_dir=published.content,
        )
    verify_issue(published.bundle)  # back, whole
    assert not aside.exists() and not unfinished.exists()
    lines = [r.getMessage() for r in caplog.records]
    assert any("put back the version a crash had moved aside" in m for m in lines), lines
    assert any("removed an unfinished publishing folder" in m for m in lines), lines
