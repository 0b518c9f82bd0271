"""``publish --encrypt``: the ciphertext bundle, versions and keys, wraps, failures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import nacl.public
import pytest
from published_bundle import PIECE, make_issue

from pressrun.cli import main
from pressrun.content.bundle import Bundle, verify_issue
from pressrun.content.encryption import decrypt_file, open_wrap
from pressrun.content.publish import PublishError, publish
from pressrun.content.versions import last_version


class Directory:
    """An in-memory subscriber directory (the protocol publish talks to)."""

    def __init__(self, n: int = 2, url: str = "http://127.0.0.1:8090/") -> None:
        self.url = url
        self.readers = [nacl.public.PrivateKey.generate() for _ in range(n)]
        self.stored: dict[tuple[str, int], dict[bytes, bytes]] = {}
        self.fail_on: str | None = None

    def subscriber_keys(self) -> list[bytes]:
        if self.fail_on == "list":
            raise ConnectionError("the service is unreachable")
        return [bytes(r.public_key) for r in self.readers]

    def store_wraps(
        self, issue_id: str, version: int, wraps: Mapping[bytes, bytes], release: object = None
    ) -> list[bytes]:
        if self.fail_on == "store":
            raise ConnectionError("the service refused the wraps")
        self.stored[(issue_id, version)] = dict(wraps)
        return []


def publish_encrypted(tmp_path: Path, key: Path, directory: Directory, **kw: object) -> Path:
    source = tmp_path / "weekly-49.pdf"
    if not source.exists():
        make_issue(source, 1_000_003)
    return publish(
        source,
        issue_id="weekly-49",
        title="Weekly 49",
        key_path=key,
        content_dir=tmp_path / "content",
        web_seeds=["http://127.0.0.1:8001"],
        piece_size=PIECE,
        encrypt_for=directory,
        **kw,  # type: ignore[arg-type]
    )


def test_the_bundle_holds_ciphertext_and_every_subscriber_a_wrap(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    d = Directory()
    bundle_dir = publish_encrypted(tmp_path, keypair[0], d)
    bundle = Bundle.load(bundle_dir)
    m = bundle.manifest
    enc = m.encryption
    assert enc is not None and enc.version == 1
    assert enc.subscriptions_url == "http://127.0.0.1:8090"
    assert m.file_name == "weekly-49.pdf.enc" and enc.plain_file_name == "weekly-49.pdf"
    assert sorted(p.name for p in bundle_dir.iterdir()) == [
        "manifest.json",
        "weekly-49.pdf.enc",
        "weekly-49.torrent",
    ]
    plain = (tmp_path / "weekly-49.pdf").read_bytes()
    assert m.size_bytes == len(plain) + 16 * m.num_pieces
    verify_issue(bundle_dir)  # signature, torrent, every ciphertext piece: no key needed
    wraps = d.stored[("weekly-49", 1)]
    assert set(wraps) == {bytes(r.public_key) for r in d.readers}
    for reader in d.readers:
        key = open_wrap(wraps[bytes(reader.public_key)], reader, enc.key_check)
        out = tmp_path / f"out-{bytes(reader.public_key).hex()[:8]}"
        decrypt_file(m, key, bundle.file_path, out)
        assert out.read_bytes() == plain


def test_a_new_version_gets_a_new_key_and_nonce_prefix(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    d = Directory(1)
    first = Bundle.load(publish_encrypted(tmp_path, keypair[0], d)).manifest.encryption
    second = Bundle.load(publish_encrypted(tmp_path, keypair[0], d, force=True)).manifest
    assert first is not None and second.encryption is not None
    assert second.encryption.version == 2
    assert second.encryption.key_check != first.key_check
    assert second.encryption.nonce_prefix != first.nonce_prefix
    assert set(d.stored) == {("weekly-49", 1), ("weekly-49", 2)}
    third = Bundle.load(publish_encrypted(tmp_path, keypair[0], d, force=True, version=9))
    assert third.manifest.encryption is not None and third.manifest.encryption.version == 9


@pytest.mark.parametrize("where", ["list", "store"])
def test_a_failing_subscription_service_publishes_nothing(
    tmp_path: Path, keypair: tuple[Path, Path], where: str
) -> None:
    d = Directory()
    d.fail_on = where
    with pytest.raises(PublishError, match=r"subscription service http://127\.0\.0\.1:8090/: "):
        publish_encrypted(tmp_path, keypair[0], d)
    content = tmp_path / "content"
    assert not content.exists() or [p.name for p in content.iterdir()] == [".pressrun"]
    # the version stays reserved (its wraps may be stored): the next publish uses 2
    if where == "store":
        assert last_version(content, "weekly-49") == 1
        d.fail_on = None
        bundle = Bundle.load(publish_encrypted(tmp_path, keypair[0], d))
        assert bundle.manifest.encryption is not None
        assert bundle.manifest.encryption.version == 2


def test_encryption_input_errors(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    source = tmp_path / ("x" * 122 + ".pdf")  # 126 characters: 130 with ".enc"
    make_issue(source, 1000)
    with pytest.raises(PublishError, match="too long for an encrypted issue"):
        publish(
            source,
            issue_id="i",
            title="t",
            key_path=keypair[0],
            content_dir=tmp_path / "c",
            encrypt_for=Directory(),
        )
    with pytest.raises(PublishError, match="only applies to an encrypted issue"):
        publish(
            source,
            issue_id="i",
            title="t",
            key_path=keypair[0],
            content_dir=tmp_path / "c",
            version=2,
        )
    with pytest.raises(PublishError, match="subscription service 'ftp://x' is not a URL"):
        publish_encrypted(tmp_path, keypair[0], Directory(url="ftp://x"))


def test_cli_keys_and_publish_flags(
    tmp_path: Path,
    keypair: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["keys", "new", "--subscriber", "--out", str(tmp_path / "reader.key")]) == 0
    out = capsys.readouterr().out
    assert "[subscriber (X25519)]" in out
    pub = (tmp_path / "reader.key.pub").read_text().strip()
    secret = bytes.fromhex((tmp_path / "reader.key").read_text().strip())
    assert bytes(nacl.public.PrivateKey(secret).public_key).hex() == pub
    source = tmp_path / "weekly-50.pdf"
    make_issue(source, 50_000)
    base = [
        "publish",
        str(source),
        "--issue",
        "weekly-50",
        "--title",
        "t",
        "--key",
        str(keypair[0]),
        "--content",
        str(tmp_path / "content"),
    ]
    monkeypatch.delenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", raising=False)
    assert main([*base, "--encrypt"]) == 1
    assert "--encrypt needs --subscriptions URL" in capsys.readouterr().err
    assert main([*base, "--encrypt", "--subscriptions", "http://127.0.0.1:9"]) == 1
    assert "needs the operator token" in capsys.readouterr().err
    assert main([*base, "--issue-version", "3"]) == 1
    assert "only apply with --encrypt" in capsys.readouterr().err
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", "t")
    # nothing listens on port 9: one line, nothing published
    assert main([*base, "--encrypt", "--subscriptions", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is unreachable" in err[0] and "nothing was published" in err[0]
    assert not (tmp_path / "content" / "weekly-50").exists()
