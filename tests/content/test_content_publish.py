"""Keys, publish and verify, through the Python API and the `pressrun` CLI."""

from __future__ import annotations

import hashlib
import json
import stat
import warnings
from pathlib import Path

import libtorrent as lt
import nacl.signing
import pytest
from published_bundle import PIECE, Published, make_issue

from pressrun.cli import main
from pressrun.content import publish as publish_module
from pressrun.content.bundle import Bundle, BundleError, list_bundles, verify_issue
from pressrun.content.keys import (
    KeyFileError,
    generate_keypair,
    load_public_key,
    load_signing_key,
)
from pressrun.content.manifest import ManifestError, SignedManifest, sign_manifest
from pressrun.content.publish import DEFAULT_PIECE_SIZE, PublishError, publish
from pressrun.durable import STATE_DIR

TAMPERED = "manifest signature does not match its content (tampered or corrupted)"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, command: str, fragment: str) -> None:
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"pressrun {command}: ")
    assert fragment in lines[0]


# --- keys ---------------------------------------------------------------------


def test_key_generation_round_trip(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    assert public == tmp_path / "publisher.key.pub"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    seed_hex = secret.read_text().strip()
    pub_hex = public.read_text().strip()
    assert len(seed_hex) == 64 and len(pub_hex) == 64
    key = load_signing_key(secret)
    assert bytes(key) == bytes.fromhex(seed_hex)
    assert bytes(key.verify_key) == load_public_key(str(public)) == load_public_key(pub_hex)
    # The pair signs and verifies.
    signature = key.sign(b"issue").signature
    nacl.signing.VerifyKey(load_public_key(public)).verify(b"issue", signature)


def test_keys_new_cli_refuses_to_overwrite_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "publisher.key"
    rc, stdout, _ = run_cli(capsys, "keys", "new", "--out", str(out))
    assert rc == 0 and str(out) in stdout
    first = out.read_text()
    rc, _, err = run_cli(capsys, "keys", "new", "--out", str(out))
    assert_one_line_error(rc, err, "keys new", "already exists; pass --force")
    assert out.read_text() == first
    rc, _, _ = run_cli(capsys, "keys", "new", "--out", str(out), "--force")
    assert rc == 0 and out.read_text() != first
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert load_public_key(str(out) + ".pub") == bytes(load_signing_key(out).verify_key)


def test_key_file_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"\x00\xffnot a key")
    with pytest.raises(KeyFileError, match="not a pressrun secret key file"):
        load_signing_key(garbage)
    with pytest.raises(KeyFileError, match="does not exist"):
        load_signing_key(tmp_path / "missing.key")
    with pytest.raises(KeyFileError, match="neither 64 hex characters nor"):
        load_public_key("abc")
    secret, _ = generate_keypair(tmp_path / "p.key")
    with pytest.raises(KeyFileError, match="looks like a secret key"):
        load_public_key(str(secret))


# --- publish then verify ----------------------------------------------------------


def test_publish_makes_the_bundle_of_the_contract(published: Published) -> None:
    assert sorted(p.name for p in published.bundle.iterdir()) == [
        "manifest.json",
        "weekly-2026-47.pdf",
        "weekly-2026-47.torrent",
    ]
    assert published.copy.read_bytes() == published.data
    assert _leftovers(published.content) == ["weekly-2026-47"]  # no temp left
    signed = SignedManifest.from_json_bytes(published.manifest_path.read_bytes())
    m = signed.verify([load_public_key(str(published.pub))])
    assert m.issue_id == "weekly-2026-47" and m.title == "Weekly, issue 47"
    assert m.size_bytes == len(published.data) and m.piece_size_bytes == PIECE
    assert m.num_pieces == -(-len(published.data) // PIECE)
    assert m.sha256 == hashlib.sha256(published.data).hexdigest()
    assert m.piece_sha256[1] == hashlib.sha256(published.data[PIECE : 2 * PIECE]).hexdigest()
    assert m.created_at.endswith("Z") and len(m.created_at) == 20


def test_torrent_parses_with_libtorrent_and_matches_the_manifest(published: Published) -> None:
    m = Bundle.load(published.bundle).manifest
    ti = lt.torrent_info(str(published.bundle / "weekly-2026-47.torrent"))
    assert str(ti.info_hashes().v1) == m.info_hash
    assert not ti.info_hashes().has_v2()
    assert ti.num_pieces() == m.num_pieces and ti.piece_length() == PIECE
    assert ti.total_size() == m.size_bytes and ti.name() == m.file_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        seeds = [w["url"] for w in ti.web_seeds()]
        trackers = [t.url for t in ti.trackers()]
    assert seeds == [
        "http://127.0.0.1:8001/content/weekly-2026-47/weekly-2026-47.pdf",
        "http://127.0.0.1:8002/content/weekly-2026-47/weekly-2026-47.pdf",
    ]
    assert trackers == ["http://127.0.0.1:6969/announce"]
    # libtorrent's SHA-1 piece hashes are of the same pieces the manifest names.
    assert (
        bytes(ti.hash_for_piece(3)) == hashlib.sha1(published.data[3 * PIECE : 4 * PIECE]).digest()
    )


def test_publish_and_verify_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "publisher.key"
    assert run_cli(capsys, "keys", "new", "--out", str(key))[0] == 0
    source = tmp_path / "monthly-12.epub"
    make_issue(source, 2 * 1024 * 1024 + 1)
    content = tmp_path / "content"
    rc, out, err = run_cli(
        capsys,
        "publish", str(source), "--issue", "monthly-12", "--title", "Monthly 12",
        "--key", str(key), "--content", str(content), "--web-seed", "http://o1:8001",
        "--piece-size", "131072",
    )  # fmt: skip
    assert rc == 0, err
    bundle = content / "monthly-12"
    m = Bundle.load(bundle).manifest
    assert f"bundle: {bundle}" in out and f"info-hash: {m.info_hash}" in out
    assert m.piece_size_bytes == 131072 and m.num_pieces == 17
    for target in (bundle, bundle / "manifest.json", bundle / "monthly-12.epub"):
        rc, out, err = run_cli(capsys, "verify", str(target), "--publisher-key", f"{key}.pub")
        assert rc == 0, err
        assert out.startswith("OK monthly-12: ") and out.count("\n") == 1
        assert "(trusted publisher)" in out


def test_verify_with_trusted_and_untrusted_keys(
    published: Published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pub_hex = published.pub.read_text().strip()
    rc, out, _ = run_cli(capsys, "verify", str(published.bundle), "--publisher-key", pub_hex)
    assert rc == 0 and "trusted publisher" in out
    rc, out, _ = run_cli(capsys, "verify", str(published.bundle))
    assert rc == 0 and "not checked against a trusted key" in out
    _, stranger = generate_keypair(tmp_path / "stranger.key")
    rc, _, err = run_cli(capsys, "verify", str(published.bundle), "--publisher-key", str(stranger))
    assert_one_line_error(
        rc, err, "verify", f"manifest signed by {pub_hex} which is not a trusted publisher"
    )
    # Trusting several keys, one of them the signer's, is fine.
    rc, _, _ = run_cli(
        capsys, "verify", str(published.bundle),
        "--publisher-key", str(stranger), "--publisher-key", str(published.pub),
    )  # fmt: skip
    assert rc == 0


def _edit_manifest(published: Published, edit: object) -> None:
    doc = json.loads(published.manifest_path.read_bytes())
    edit(doc)  # type: ignore[operator]
    published.manifest_path.write_text(json.dumps(doc, indent=2))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["manifest"].update(title="Weekly, issue 48"),
        lambda d: d["manifest"]["piece_sha256"].__setitem__(2, "00" * 32),
        lambda d: d.update(signature=f"{int(d['signature'][0], 16) ^ 1:x}{d['signature'][1:]}"),
    ],
    ids=["title", "piece-hash", "signature-byte"],
)
def test_tampered_manifest_is_rejected(
    published: Published, capsys: pytest.CaptureFixture[str], edit: object
) -> None:
    _edit_manifest(published, edit)
    rc, _, err = run_cli(
        capsys, "verify", str(published.bundle), "--publisher-key", str(published.pub)
    )
    assert_one_line_error(rc, err, "verify", TAMPERED)
    with pytest.raises(ManifestError, match="tampered"):
        Bundle.load(published.bundle)


def test_resigned_manifest_with_another_torrent_hash_is_caught(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    signed = SignedManifest.from_json_bytes(published.manifest_path.read_bytes())
    from dataclasses import replace

    forged = sign_manifest(
        replace(signed.manifest, info_hash="cd" * 20), load_signing_key(published.key)
    )
    published.manifest_path.write_bytes(forged.to_json_bytes())
    rc, _, err = run_cli(capsys, "verify", str(published.bundle))
    assert_one_line_error(rc, err, "verify", "but the manifest signs " + "cd" * 20)


def test_corrupted_byte_is_found_in_the_right_piece(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    offset = 7 * PIECE + 4321
    with open(published.copy, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))
    bundle = Bundle.load(published.bundle)  # cheap load does not read the content
    from pressrun.content.manifest import bad_pieces

    assert bad_pieces(bundle.manifest, published.copy) == [7]
    with pytest.raises(BundleError, match=r"1 of \d+ pieces do not match the manifest \(piece 7\)"):
        bundle.check_content()
    rc, _, err = run_cli(capsys, "verify", str(published.copy))
    assert_one_line_error(rc, err, "verify", "(piece 7); the copy is corrupted")


def test_truncated_copy_and_lone_file(
    published: Published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A reader's copy with only the manifest beside it (no torrent) still verifies.
    reader = tmp_path / "reader"
    reader.mkdir()
    (reader / "manifest.json").write_bytes(published.manifest_path.read_bytes())
    copy = reader / "weekly-2026-47.pdf"
    copy.write_bytes(published.data)
    report = verify_issue(copy, [load_public_key(str(published.pub))])
    assert report.torrent_path is None and "no torrent checked" in report.summary()
    copy.write_bytes(published.data[:-1])
    rc, _, err = run_cli(capsys, "verify", str(copy))
    assert_one_line_error(rc, err, "verify", f"is {len(published.data) - 1} bytes but")
    lone = tmp_path / "lone.pdf"
    lone.write_bytes(b"x")
    rc, _, err = run_cli(capsys, "verify", str(lone))
    assert_one_line_error(rc, err, "verify", "no manifest.json beside")
    rc, _, err = run_cli(capsys, "verify", str(tmp_path / "nothing"))
    assert_one_line_error(rc, err, "verify", "does not exist")


# --- publish failures -------------------------------------------------------------


def _publish_args(source: Path, key: Path, content: Path, issue: str = "weekly-48") -> list[str]:
    return ["publish", str(source), "--issue", issue, "--title", "Weekly 48",
            "--key", str(key), "--content", str(content)]  # fmt: skip


def _leftovers(content: Path) -> list[str]:
    """What CONTENT holds besides pressrun's own state (``.pressrun/``), which may
    hold locks and issue versions only: no swap journal, no temp file."""
    if not content.exists():
        return []
    state = content / STATE_DIR
    if state.exists():
        extra = [p.name for p in state.iterdir() if p.suffix not in (".lock", ".version")]
        assert extra == [], extra
    return sorted(p.name for p in content.iterdir() if p.name != STATE_DIR)


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("missing-file", "does not exist"),
        ("empty-file", "is empty"),
        ("bad-issue-id", "issue id '../x' is not allowed"),
        ("garbage-key", "is not a pressrun secret key file"),
        ("missing-key", "secret key file"),
        ("bad-piece-size", "must be a power of two"),
        ("bad-web-seed", "is not a URL"),
        ("bad-title", "title is not valid UTF-8"),
    ],
)
def test_publish_errors_are_one_line_and_leave_nothing(
    tmp_path: Path,
    keypair: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    case: str,
    fragment: str,
) -> None:
    content = tmp_path / "content"
    content.mkdir()
    source = tmp_path / "weekly-48.pdf"
    make_issue(source, 100_000)
    key = keypair[0]
    args = _publish_args(source, key, content)
    if case == "missing-file":
        args[1] = str(tmp_path / "nope.pdf")
    elif case == "empty-file":
        source.write_bytes(b"")
    elif case == "bad-issue-id":
        args[3] = "../x"
    elif case == "garbage-key":
        bad = tmp_path / "garbage.key"
        bad.write_text("this is not a key\n")
        args[7] = str(bad)
    elif case == "missing-key":
        args[7] = str(tmp_path / "nokey")
    elif case == "bad-piece-size":
        args += ["--piece-size", "100000"]
    elif case == "bad-web-seed":
        args += ["--web-seed", "origin-a:8001"]
    elif case == "bad-title":
        args[5] = "Weekly \udcff"  # how a non-UTF-8 argv byte arrives
    rc, out, err = run_cli(capsys, *args)
    assert_one_line_error(rc, err, "publish", fragment)
    assert out == ""
    assert _leftovers(content) == []


def test_existing_bundle_is_refused_unless_forced(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    before = published.manifest_path.read_bytes()
    source = published.source
    make_issue(source, 200_000, seed=48)
    args = _publish_args(source, published.key, published.content, issue="weekly-2026-47")
    rc, _, err = run_cli(capsys, *args)
    assert_one_line_error(rc, err, "publish", "already exists")
    assert published.manifest_path.read_bytes() == before
    assert _leftovers(published.content) == ["weekly-2026-47"]
    rc, _, err = run_cli(capsys, *args, "--force")
    assert rc == 0, err
    assert Bundle.load(published.bundle).manifest.size_bytes == 200_000
    assert _leftovers(published.content) == ["weekly-2026-47"]
    verify_issue(published.bundle)


def test_failure_while_making_the_torrent_keeps_the_old_bundle(
    published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {p.name: p.read_bytes() for p in published.bundle.iterdir()}

    def broken(*args: object, **kwargs: object) -> bytes:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(publish_module, "make_torrent", broken)
    with pytest.raises(PublishError, match="could not make the torrent: disk on fire"):
        publish(
            published.source,
            issue_id="weekly-2026-47",
            title="again",
            key_path=published.key,
            content_dir=published.content,
            force=True,
        )
    assert _leftovers(published.content) == ["weekly-2026-47"]
    assert {p.name: p.read_bytes() for p in published.bundle.iterdir()} == before


def test_progress_callback_reports_both_stages(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    source = tmp_path / "p.pdf"
    make_issue(source, 3_000_000)
    seen: dict[str, list[tuple[int, int]]] = {}
    publish(
        source,
        issue_id="p",
        title="P",
        key_path=keypair[0],
        content_dir=tmp_path / "c",
        progress=lambda stage, done, total: seen.setdefault(stage, []).append((done, total)),
    )
    assert seen["hashing"][-1] == (3_000_000, 3_000_000)
    assert seen["torrent"][-1] == (3_000_000, 3_000_000)
    assert len(seen["torrent"]) == -(-3_000_000 // DEFAULT_PIECE_SIZE)  # one call per piece


def test_list_bundles_skips_broken_and_temp_folders(
    published: Published, keypair: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    content = published.content
    (content / ".weekly-49.publishing-abc").mkdir()  # a publish in progress
    (content / "broken").mkdir()
    (content / "broken" / "manifest.json").write_text("{")
    (content / "README.txt").write_text("not a bundle")
    bundles = list_bundles(content, [load_public_key(str(published.pub))])
    assert list(bundles) == ["weekly-2026-47"]
    assert bundles["weekly-2026-47"].file_path == published.copy
    assert "skipping bundle" in caplog.text and "broken" in caplog.text
    assert list_bundles(content / "absent") == {}


def test_bundle_in_a_folder_named_after_another_issue(published: Published) -> None:
    moved = published.content / "weekly-2026-48"
    published.bundle.rename(moved)
    with pytest.raises(BundleError, match="holds the manifest of issue weekly-2026-47"):
        Bundle.load(moved)


@pytest.mark.parametrize(
    ("size", "piece"),
    [
        (1, 16384),
        (16383, 16384),
        (16384, 16384),
        (16385, 16384),
        (3 * 16384, 16384),
        (5 * 1024 * 1024 + 3, 2 * 1024 * 1024),  # pieces span several 1 MiB read chunks
    ],
)
def test_piece_boundaries_agree_with_libtorrent(
    tmp_path: Path, keypair: tuple[Path, Path], size: int, piece: int
) -> None:
    source = tmp_path / "edge.pdf"
    data = make_issue(source, size, seed=size)
    bundle = publish(
        source,
        issue_id="edge",
        title="Edge",
        key_path=keypair[0],
        content_dir=tmp_path / "c",
        piece_size=piece,
    )
    m = Bundle.load(bundle).manifest
    ti = lt.torrent_info(str(bundle / "edge.torrent"))
    assert m.num_pieces == ti.num_pieces() == -(-size // piece)
    for i in range(m.num_pieces):
        offset, length = m.piece_span(i)
        assert length == ti.piece_size(i)
        chunk = data[offset : offset + length]
        assert m.piece_sha256[i] == hashlib.sha256(chunk).hexdigest()
        assert bytes(ti.hash_for_piece(i)) == hashlib.sha1(chunk).digest()
    verify_issue(bundle)
