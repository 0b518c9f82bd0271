"""Encrypted issues: the piece format (with the docs' test vector), tampering, wraps."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import nacl.public
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.content.codec import (
    ENCRYPTION_SCHEME,
    Encryption,
    Manifest,
    ManifestError,
    encrypted_size,
    manifest_from_dict,
    piece_associated_data,
    piece_nonce,
)
from pressrun.content.encryption import (
    DecryptError,
    PieceCipher,
    WrapError,
    decrypt_file,
    encrypt_stream,
    key_check,
    new_content_key,
    new_nonce_prefix,
    open_wrap,
    wrap_key,
)
from pressrun.content.keys import generate_keypair, load_public_key, load_subscriber_key

KEY = bytes(range(32))
PREFIX = bytes(range(0x40, 0x50))


def vector_cipher() -> PieceCipher:
    return PieceCipher(
        key=KEY,
        issue_id="weekly-2026-47",
        version=1,
        nonce_prefix=PREFIX,
        plain_size_bytes=100,
        piece_size_bytes=64,
    )


def test_docs_test_vector() -> None:
    """The exact bytes docs/protocols.md gives a JavaScript implementation to check."""
    assert piece_nonce(PREFIX, 1).hex() == "404142434445464748494a4b4c4d4e4f0000000000000001"
    assert piece_associated_data("weekly-2026-47", 1, 1, 3, 100).hex() == (
        "707265737372756e2d70696563652d76310e7765656b6c792d323032362d3437"
        "0000000000000001000000000000000100000000000000030000000000000064"
    )
    ct = vector_cipher().encrypt(1, bytes(range(0x30, 0x60)))
    assert ct.hex() == (
        "8bda04a206f3b1cfd3575e43dab76541fa87369aae1765e2059079812525c8f8"
        "87e18d3ac43685b9924d4ccfa29d7cb7932602eeee81253e295499fc0b2f7f40"
    )
    assert key_check(KEY).hex() == (
        "bd629f8e2a3c0a6e58ebde15bf3f39c8df5998629319a50c8b2e6e341e3e86c2"
    )


def encrypt_all(cipher: PieceCipher, plain: bytes) -> list[bytes]:
    c = cipher.plain_piece_bytes
    return [cipher.encrypt(i, plain[i * c : (i + 1) * c]) for i in range(cipher.num_pieces)]


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 5000),
    piece_pow=st.integers(5, 10),
    order_seed=st.integers(0, 1 << 30),
)
def test_any_piece_decrypts_on_its_own_in_any_order(
    size: int, piece_pow: int, order_seed: int
) -> None:
    plain = random.Random(size).randbytes(size)
    cipher = PieceCipher(KEY, "mag-1", 3, PREFIX, size, 2**piece_pow)
    pieces = encrypt_all(cipher, plain)
    assert sum(len(p) for p in pieces) == encrypted_size(size, 2**piece_pow)
    assert all(len(p) == 2**piece_pow for p in pieces[:-1])
    order = list(range(len(pieces)))
    random.Random(order_seed).shuffle(order)
    out: dict[int, bytes] = {i: cipher.decrypt(i, pieces[i]) for i in order}
    assert b"".join(out[i] for i in range(len(pieces))) == plain


def test_swapped_reordered_truncated_or_foreign_pieces_fail() -> None:
    plain = random.Random(1).randbytes(1000)
    cipher = PieceCipher(KEY, "mag-1", 1, PREFIX, len(plain), 256)
    pieces = encrypt_all(cipher, plain)
    assert len(pieces) == 5
    # swapped: piece 1's bytes at index 2
    with pytest.raises(DecryptError, match="piece 2 of mag-1 fails authentication"):
        cipher.decrypt(2, pieces[1])
    # reordered: the last (short) piece presented as the first
    with pytest.raises(DecryptError):
        cipher.decrypt(0, pieces[-1])
    # a piece cut short by one byte, or with a flipped bit
    with pytest.raises(DecryptError):
        cipher.decrypt(3, pieces[3][:-1])
    flipped = bytearray(pieces[3])
    flipped[7] ^= 1
    with pytest.raises(DecryptError):
        cipher.decrypt(3, bytes(flipped))
    # truncation of the file: a reader told the file has 4 pieces (plaintext size of
    # 4 chunks) cannot accept piece 3, which was sealed as one of 5
    short = PieceCipher(KEY, "mag-1", 1, PREFIX, 4 * 240, 256)
    with pytest.raises(DecryptError):
        short.decrypt(3, pieces[3])
    # the same piece under another issue id or another version
    for other in (
        PieceCipher(KEY, "mag-2", 1, PREFIX, len(plain), 256),
        PieceCipher(KEY, "mag-1", 2, PREFIX, len(plain), 256),
        PieceCipher(new_content_key(), "mag-1", 1, PREFIX, len(plain), 256),
    ):
        with pytest.raises(DecryptError):
            other.decrypt(1, pieces[1])
    with pytest.raises(DecryptError, match="outside the issue"):
        cipher.decrypt(5, pieces[4])


def test_a_wrap_opens_only_for_its_subscriber_and_its_issue() -> None:
    alice, bob = nacl.public.PrivateKey.generate(), nacl.public.PrivateKey.generate()
    key = new_content_key()
    wrap = wrap_key(key, bytes(alice.public_key))
    assert len(wrap) == 80
    assert open_wrap(wrap, alice, key_check(key)) == key
    with pytest.raises(WrapError, match="does not open with this subscriber key"):
        open_wrap(wrap, bob, key_check(key))
    # a wrap of another issue version opens, but to a key that fails the check
    other = wrap_key(new_content_key(), bytes(alice.public_key))
    with pytest.raises(WrapError, match="another key"):
        open_wrap(other, alice, key_check(key))
    with pytest.raises(WrapError):
        open_wrap(wrap[:-1], alice, key_check(key))


def encrypted_manifest(plain: bytes, key: bytes, piece: int = 1024) -> tuple[Manifest, bytes]:
    prefix = new_nonce_prefix()
    cipher = PieceCipher(key, "mag-1", 1, prefix, len(plain), piece)
    ct = b"".join(encrypt_all(cipher, plain))
    hashes = tuple(hashlib.sha256(ct[i : i + piece]).hexdigest() for i in range(0, len(ct), piece))
    m = Manifest(
        format=1,
        issue_id="mag-1",
        title="t",
        file_name="mag-1.pdf.enc",
        size_bytes=len(ct),
        piece_size_bytes=piece,
        piece_sha256=hashes,
        sha256=hashlib.sha256(ct).hexdigest(),
        info_hash="0" * 40,
        publisher_key="0" * 64,
        created_at="2026-11-23T18:00:00Z",
        encryption=Encryption(
            scheme=ENCRYPTION_SCHEME,
            version=1,
            nonce_prefix=prefix,
            key_check=key_check(key),
            plain_file_name="mag-1.pdf",
            plain_size_bytes=len(plain),
            plain_sha256=hashlib.sha256(plain).hexdigest(),
            subscriptions_url="http://127.0.0.1:8090",
        ),
    )
    return m, ct


def test_manifest_encryption_round_trip_and_validation() -> None:
    m, _ = encrypted_manifest(b"x" * 5000, new_content_key())
    assert manifest_from_dict(m.to_dict()) == m
    assert m.plain_span(4) == (4 * 1008, 5000 - 4 * 1008)
    d = m.to_dict()
    d["size_bytes"] += 1
    with pytest.raises(ManifestError, match="not the ciphertext size"):
        manifest_from_dict(d)
    for field, value, message in (
        ("scheme", "aes", "scheme 'aes' is not supported"),
        ("nonce_prefix", "00", "nonce_prefix must be 32"),
        ("subscriptions_url", "ftp://x", "not an http"),
        ("version", 0, "version must be at least 1"),
        ("plain_file_name", "../x", "not a valid file name"),
    ):
        d = m.to_dict()
        d["encryption"][field] = value
        with pytest.raises(ManifestError, match=message):
            manifest_from_dict(d)
    d = m.to_dict()
    d["encryption"]["extra"] = 1
    with pytest.raises(ManifestError, match="unknown field"):
        manifest_from_dict(d)


def test_decrypt_file_is_all_or_nothing(tmp_path: Path) -> None:
    plain = random.Random(5).randbytes(10_000)
    key = new_content_key()
    m, ct = encrypted_manifest(plain, key)
    src, out = tmp_path / "c.enc", tmp_path / "p.pdf"
    src.write_bytes(ct)
    decrypt_file(m, key, src, out)
    assert out.read_bytes() == plain
    out.unlink()
    # damage the last piece: nothing is left behind, not even the good first pieces
    src.write_bytes(ct[:-1] + bytes([ct[-1] ^ 1]))
    with pytest.raises(DecryptError, match="fails authentication"):
        decrypt_file(m, key, src, out)
    assert not out.exists()
    src.write_bytes(ct[:-100])
    with pytest.raises(DecryptError, match="truncated"):
        decrypt_file(m, key, src, out)
    assert not out.exists()
    # an existing file is never overwritten
    out.write_bytes(b"keep")
    src.write_bytes(ct)
    with pytest.raises(FileExistsError):
        decrypt_file(m, key, src, out)
    assert out.read_bytes() == b"keep"


def test_encrypt_stream_matches_piece_cipher(tmp_path: Path) -> None:
    plain = random.Random(9).randbytes(3000)
    src = tmp_path / "p"
    src.write_bytes(plain)
    cipher = PieceCipher(KEY, "mag-1", 1, PREFIX, len(plain), 512)
    got: list[tuple[int, bytes]] = []
    sha = encrypt_stream(cipher, src, lambda i, c: got.append((i, c)))
    assert sha == hashlib.sha256(plain).hexdigest()
    assert [c for _, c in got] == encrypt_all(cipher, plain)
    src.write_bytes(plain + b"!")
    with pytest.raises(ManifestError, match=r"changed size|grew"):
        encrypt_stream(cipher, src, lambda i, c: None)


def test_subscriber_key_files(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "reader.key", subscriber=True)
    sk = load_subscriber_key(secret)
    assert bytes(sk.public_key) == load_public_key(public, "subscriber key")
    assert secret.stat().st_mode & 0o077 == 0
    with pytest.raises(Exception, match="keys new --subscriber"):
        load_subscriber_key(tmp_path / "missing.key")
