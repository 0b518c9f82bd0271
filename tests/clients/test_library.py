"""The library on disk: pressrun's own files apart from the issue's, recovery of what a
crash left (including the leftovers of pressrun before issue 27), and ``pressrun
verify`` on a library's issue folder."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from pressrun.cli import main
from pressrun.clients.codec import ResumeState
from pressrun.clients.library import Library, LibraryError
from pressrun.content.bundle import BundleError, verify_issue
from pressrun.content.codec import FORMAT, Manifest
from pressrun.content.keys import generate_keypair, load_signing_key
from pressrun.content.manifest import sign_manifest

PIECE = 16384


def signed_manifest(
    tmp_path: Path, data: bytes, file_name: str, issue_id: str = "mag-1"
) -> tuple[bytes, bytes]:
    """A signed manifest of ``data`` (as ``file_name``), and the publisher's key."""
    key_path = tmp_path / "publisher.key"
    if not key_path.exists():
        generate_keypair(key_path)
    key = load_signing_key(key_path)
    pieces = [hashlib.sha256(data[i : i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)]
    m = Manifest(
        format=FORMAT,
        issue_id=issue_id,
        title="Magazine",
        file_name=file_name,
        size_bytes=len(data),
        piece_size_bytes=PIECE,
        piece_sha256=tuple(pieces),
        sha256=hashlib.sha256(data).hexdigest(),
        info_hash="0" * 40,
        publisher_key=bytes(key.verify_key).hex(),
        created_at="2026-11-28T00:00:00Z",
    )
    return sign_manifest(m, key).to_json_bytes(), bytes(key.verify_key)


def partial_download(lib: Library, data: bytes, name: str, manifest_json: bytes) -> Path:
    """A complete, verified partial download of ``data`` as ``name``."""
    path = lib.prepare_partial("mag-1", name, len(data), manifest_json, fresh=True)
    path.write_bytes(data)
    m = json.loads(manifest_json)["manifest"]
    lib.save_state(
        ResumeState(
            issue_id="mag-1",
            file_name=name,
            sha256=m["sha256"],
            size_bytes=len(data),
            piece_size_bytes=PIECE,
            verified=frozenset(range(len(m["piece_sha256"]))),
        )
    )
    return path


@pytest.mark.parametrize("name", ["manifest.json", "state.json", "mag-1.pdf"])
def test_an_issue_file_named_like_pressrun_files_is_only_a_file(tmp_path: Path, name: str) -> None:
    data = random.Random(name).randbytes(3 * PIECE + 5)
    manifest_json, _ = signed_manifest(tmp_path, data, name)
    lib = Library(tmp_path / "lib")
    lib.ensure()
    partial_download(lib, data, name, manifest_json)
    assert lib.load_state("mag-1") is not None  # the issue's file is not the state
    final = lib.install("mag-1", name, manifest_json)
    assert final.read_bytes() == data  # not the manifest written over it
    assert lib.installed_manifest("mag-1") == manifest_json
    report = verify_issue(final.parent)  # the folder, as `pressrun verify LIB/mag-1`
    assert report.file_path == final
    assert not (tmp_path / "lib" / ".partial").exists()


def test_verify_of_a_library_folder_and_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = random.Random(5).randbytes(2 * PIECE + 1)
    manifest_json, public = signed_manifest(tmp_path, data, "mag-1.pdf")
    lib = Library(tmp_path / "lib")
    lib.ensure()
    partial_download(lib, data, "mag-1.pdf", manifest_json)
    final = lib.install("mag-1", "mag-1.pdf", manifest_json)
    for target in (final.parent, final):
        assert main(["verify", str(target), "--publisher-key", public.hex()]) == 0
        out = capsys.readouterr().out
        assert out.startswith("OK mag-1: mag-1.pdf, 32769 bytes, 3 pieces match, no torrent")
    flipped = bytearray(data)
    flipped[PIECE + 7] ^= 1
    final.write_bytes(bytes(flipped))
    with pytest.raises(BundleError, match=r"1 of 3 pieces do not match the manifest \(piece 1\)"):
        verify_issue(final.parent)


def test_a_get_killed_after_moving_the_file_out_of_partial_keeps_it(tmp_path: Path) -> None:
    # what pressrun before issue 27 left: the verified file in `.mag-1.arriving-*`
    data = random.Random(6).randbytes(2 * PIECE)
    manifest_json, _ = signed_manifest(tmp_path, data, "mag-1.pdf")
    lib = Library(tmp_path / "lib")
    lib.ensure()
    partial = partial_download(lib, data, "mag-1.pdf", manifest_json)
    arriving = tmp_path / "lib" / ".mag-1.arriving-abc123"
    arriving.mkdir()
    partial.rename(arriving / "mag-1.pdf")
    done = lib.recover()
    assert done == ["mag-1: removed an unfinished arriving folder (.mag-1.arriving-abc123)"]
    assert not arriving.exists()
    assert partial.read_bytes() == data  # back where the next get resumes from
    state = lib.load_state("mag-1")
    assert state is not None and len(state.verified) == 2


def test_a_get_killed_between_the_two_renames_of_old_pressrun_is_put_back(
    tmp_path: Path,
) -> None:
    # pressrun before issue 27: the old copy renamed aside, the new one not yet in
    data = random.Random(7).randbytes(PIECE)
    manifest_json, _ = signed_manifest(tmp_path, data, "mag-1.pdf")
    root = tmp_path / "lib"
    aside = root / ".mag-1.replaced-xyz"
    aside.mkdir(parents=True)
    (aside / "mag-1.pdf").write_bytes(data)
    (aside / "manifest.json").write_bytes(manifest_json)
    arriving = root / ".mag-1.arriving-xyz"
    arriving.mkdir()
    (arriving / "mag-1.pdf").write_bytes(data)
    lib = Library(root)
    done = lib.recover()
    assert "mag-1: put back the version a crash had moved aside" in done
    assert sorted(p.name for p in root.iterdir()) == [".pressrun", "mag-1"]
    assert lib.installed_manifest("mag-1") == manifest_json  # the old name, still read
    verify_issue(root / "mag-1" / "mag-1.pdf")


def test_a_second_get_of_the_same_issue_waits_for_none(tmp_path: Path) -> None:
    lib = Library(tmp_path / "lib")
    lib.ensure()
    with (
        lib.lock("mag-1"),
        pytest.raises(LibraryError, match="another pressrun get of mag-1"),
        lib.lock("mag-1"),
    ):
        pass
    with lib.lock("mag-1"):  # released: free again
        pass


async def test_an_issue_id_that_is_a_path_names_no_file(tmp_path: Path) -> None:
    from pressrun.clients.aio import FetchError, fetch_issue
    from pressrun.clients.config import DESKTOP

    with pytest.raises(FetchError, match=r"'\.\./\.\./escape' is not an issue id"):
        await fetch_issue(
            "../../escape",
            balancer_url="http://127.0.0.1:9",
            library=tmp_path / "a" / "lib",
            config=DESKTOP,
            trusted_keys=None,
        )
    assert not (tmp_path / "a" / "lib").exists() and not (tmp_path / "escape.lock").exists()


def test_a_plaintext_installed_while_its_ciphertext_is_seeded_keeps_the_partial_folder(
    tmp_path: Path,
) -> None:
    """An encrypted issue: the peer seeds the ciphertext, the plaintext decrypted beside
    it moves into the library; the partial folder, with the seeded ciphertext and the
    download's state, stays until the seeding ends (it was removed at the install, and
    the state saved after the seeding failed: "cannot record the download state")."""
    data = random.Random(9).randbytes(3 * PIECE + 7)
    manifest_json, _ = signed_manifest(tmp_path, data, "mag-1.pdf")
    lib = Library(tmp_path / "lib")
    lib.ensure()
    plain = partial_download(lib, data, "mag-1.pdf", manifest_json)
    seeded = plain.with_name("mag-1.pdf.enc")
    seeded.write_bytes(b"ciphertext")
    final = lib.install("mag-1", "mag-1.pdf", manifest_json, keep_partial=True)
    assert final.read_bytes() == data and not plain.exists()  # moved, not linked
    assert seeded.read_bytes() == b"ciphertext"  # still where the peer reads it
    state = lib.load_state("mag-1")
    assert state is not None
    lib.save_state(state)  # the download's state can still be recorded
    lib.discard_partial("mag-1")  # after the seeding
    assert not seeded.exists() and final.read_bytes() == data


def test_an_install_while_the_peer_seeds_leaves_the_seeded_file(tmp_path: Path) -> None:
    """The copy goes into the library before its seeding (a swarm peer seeds for up to
    30 min): the seeded file stays in ``.partial`` and the library's names the same
    bytes; the partial folder goes after the seeding, or, after a crash in between, at
    the next run's recovery."""
    data = random.Random(8).randbytes(3 * PIECE + 9)
    manifest_json, _ = signed_manifest(tmp_path, data, "mag-1.pdf")
    lib = Library(tmp_path / "lib")
    lib.ensure()
    seeded = partial_download(lib, data, "mag-1.pdf", manifest_json)
    final = lib.install("mag-1", "mag-1.pdf", manifest_json, seeding=True)
    assert final.read_bytes() == data and lib.installed_manifest("mag-1") == manifest_json
    assert seeded.read_bytes() == data  # still where the peer reads it
    assert final.stat().st_ino == seeded.stat().st_ino  # a link: no second copy on disk
    verify_issue(final.parent)
    # the process ends while seeding: the next run removes the leftover partial
    assert lib.recover() == ["mag-1: removed the leftover partial download"]
    assert not seeded.exists() and final.read_bytes() == data
