"""The manifest: JSON round trip, canonical bytes, signatures, piece arithmetic."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import nacl.signing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pressrun.content.codec import NAME_RE, Manifest, manifest_from_dict, parse_torrent
from pressrun.content.manifest import (
    ManifestError,
    SignedManifest,
    bad_pieces,
    check_file,
    file_sha256,
    piece_ok,
    sign_manifest,
    verify_signature,
)

KEY = nacl.signing.SigningKey(bytes(range(32)))
OTHER_KEY = nacl.signing.SigningKey(bytes(range(1, 33)))
TAMPERED = "manifest signature does not match its content (tampered or corrupted)"

hex64 = st.binary(min_size=32, max_size=32).map(bytes.hex)


@st.composite
def manifests(draw: st.DrawFn, key: nacl.signing.SigningKey = KEY) -> Manifest:
    piece = 2 ** draw(st.integers(4, 20))
    n = draw(st.integers(1, 12))
    size = (n - 1) * piece + draw(st.integers(1, piece))
    when = draw(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 1, 1)))
    return Manifest(
        format=1,
        issue_id=draw(st.from_regex(NAME_RE, fullmatch=True)),
        title=draw(st.text(max_size=60)),
        file_name=draw(st.from_regex(NAME_RE, fullmatch=True)),
        size_bytes=size,
        piece_size_bytes=piece,
        piece_sha256=tuple(draw(st.lists(hex64, min_size=n, max_size=n))),
        sha256=draw(hex64),
        info_hash=draw(st.binary(min_size=20, max_size=20).map(bytes.hex)),
        publisher_key=bytes(key.verify_key).hex(),
        created_at=when.replace(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def small_manifest(data: bytes, piece: int = 16, key: nacl.signing.SigningKey = KEY) -> Manifest:
    pieces = tuple(
        hashlib.sha256(data[i : i + piece]).hexdigest() for i in range(0, len(data), piece)
    )
    return Manifest(
        format=1,
        issue_id="weekly-2026-47",
        title="Weekly, issue 47",
        file_name="weekly-2026-47.pdf",
        size_bytes=len(data),
        piece_size_bytes=piece,
        piece_sha256=pieces,
        sha256=hashlib.sha256(data).hexdigest(),
        info_hash="ab" * 20,
        publisher_key=bytes(key.verify_key).hex(),
        created_at="2026-11-22T20:00:00Z",
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_signed_manifest_json_round_trips(m: Manifest) -> None:
    signed = sign_manifest(m, KEY)
    again = SignedManifest.from_json_bytes(signed.to_json_bytes())
    assert again == signed
    assert again.verify() == m
    assert again.manifest.canonical_bytes() == m.canonical_bytes()
    assert manifest_from_dict(json.loads(m.canonical_bytes())) == m


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.data())
def test_any_single_byte_change_to_canonical_bytes_fails_verification(
    m: Manifest, data: st.DataObject
) -> None:
    signed = sign_manifest(m, KEY)
    canonical = m.canonical_bytes()
    at = data.draw(st.integers(0, len(canonical) - 1), label="offset")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != canonical[at]), label="byte")
    mutated = canonical[:at] + bytes([new]) + canonical[at + 1 :]
    # At the signature level: the Ed25519 check itself fails.
    with pytest.raises(ManifestError, match="tampered or corrupted"):
        verify_signature(mutated, signed.signature, m.publisher_key_bytes)
    # End to end: a manifest.json carrying the mutated object is refused, either as
    # malformed or as tampered, never accepted.
    doc = b'{"manifest":' + mutated + b',"signature":"' + signed.signature.hex().encode() + b'"}'
    with pytest.raises(ManifestError):
        SignedManifest.from_json_bytes(doc).verify()


def _doc(m: Manifest, key: nacl.signing.SigningKey = KEY) -> dict[str, object]:
    doc: dict[str, object] = json.loads(sign_manifest(m, key).to_json_bytes())
    return doc


def test_tampered_fields_are_refused_with_the_tampered_message() -> None:
    m = small_manifest(b"x" * 100)
    for field, value in [
        ("title", "Weekly, issue 48"),
        ("piece_sha256", ["00" * 32, *m.piece_sha256[1:]]),
        ("size_bytes", 99),
        ("info_hash", "cd" * 20),
    ]:
        doc = _doc(m)
        inner = doc["manifest"]
        assert isinstance(inner, dict)
        inner[field] = value
        signed = SignedManifest.from_json_bytes(json.dumps(doc).encode())
        with pytest.raises(ManifestError) as err:
            signed.verify()
        assert str(err.value) == TAMPERED, field


def test_flipped_signature_byte_is_refused() -> None:
    signed = sign_manifest(small_manifest(b"y" * 40), KEY)
    for i in (0, 31, 63):
        sig = bytearray(signed.signature)
        sig[i] ^= 0x01
        with pytest.raises(ManifestError) as err:
            SignedManifest(signed.manifest, bytes(sig)).verify()
        assert str(err.value) == TAMPERED


def test_trusted_keys() -> None:
    m = small_manifest(b"z" * 33)
    signed = sign_manifest(m, KEY)
    assert signed.verify([bytes(KEY.verify_key)]) == m
    assert signed.verify({bytes(OTHER_KEY.verify_key), bytes(KEY.verify_key)}) == m
    with pytest.raises(ManifestError) as err:
        signed.verify([bytes(OTHER_KEY.verify_key)])
    assert str(err.value) == (
        f"manifest signed by {m.publisher_key} which is not a trusted publisher"
    )
    # A manifest naming key A but signed by key B cannot be made.
    with pytest.raises(ManifestError, match="being signed with"):
        sign_manifest(m, OTHER_KEY)
    # ...and one forged that way does not verify.
    forged = SignedManifest(m, OTHER_KEY.sign(m.canonical_bytes()).signature)
    with pytest.raises(ManifestError, match="tampered"):
        forged.verify()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("title"), "missing field(s): title"),
        (lambda d: d.update(extra=1), "unknown field(s): extra"),
        (lambda d: d.update(format=2), "format 2 is not supported"),
        (lambda d: d.update(size_bytes=100.0), "size_bytes must be an integer, not a number"),
        (lambda d: d.update(size_bytes=True), "size_bytes must be an integer, not a boolean"),
        (lambda d: d.update(size_bytes=0), "size_bytes must be at least 1"),
        (lambda d: d.update(title=None), "title must be a string, not null"),
        (lambda d: d.update(sha256="AB" * 32), "sha256 must be 64 lower-case hex"),
        (lambda d: d.update(info_hash="ab" * 19), "info_hash must be 40 lower-case hex"),
        (lambda d: d.update(publisher_key="zz" * 32), "publisher_key must be 64 lower-case"),
        (lambda d: d.update(issue_id="../etc"), "not a valid issue id"),
        (lambda d: d.update(file_name="a b.pdf"), "not a valid file name"),
        (lambda d: d.update(piece_sha256=["ab" * 32]), "lists 1 piece hashes but 100 bytes"),
        (lambda d: d.update(piece_sha256="ab"), "piece_sha256 must be a list"),
        (lambda d: d.update(created_at="yesterday"), "is not a UTC time"),
        (lambda d: d.update(title="\ud800"), "lone surrogate"),
    ],
)
def test_malformed_manifest_fields(change: object, message: str) -> None:
    doc = _doc(small_manifest(b"q" * 100))
    inner = doc["manifest"]
    assert isinstance(inner, dict)
    change(inner)  # type: ignore[operator]
    with pytest.raises(ManifestError) as err:
        SignedManifest.from_json_bytes(json.dumps(doc).encode())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[]", "must hold a JSON object, not a list"),
        (b'{"manifest": {}}', "missing signature"),
        (b"[" * 100000 + b"]" * 100000, "manifest.json"),
    ],
)
def test_malformed_manifest_documents(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError) as err:
        SignedManifest.from_json_bytes(data)
    assert message in str(err.value)


def test_bad_signature_hex() -> None:
    doc = _doc(small_manifest(b"q" * 10))
    doc["signature"] = "AB" * 64
    with pytest.raises(ManifestError, match="128 lower-case hex"):
        SignedManifest.from_json_bytes(json.dumps(doc).encode())


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_another_exception(data: bytes) -> None:
    # Random bytes are never a validly signed manifest; the refusal is one line.
    with pytest.raises(ManifestError) as err:
        SignedManifest.from_json_bytes(data).verify()
    assert str(err.value) and "\n" not in str(err.value)


def test_piece_span_and_count() -> None:
    m = small_manifest(b"a" * 100, piece=16)
    assert m.num_pieces == 7
    assert m.piece_span(0) == (0, 16)
    assert m.piece_span(6) == (96, 4)
    with pytest.raises(IndexError):
        m.piece_span(7)
    with pytest.raises(IndexError):
        m.piece_span(-1)


@given(st.integers(1, 2000), st.sampled_from([16, 64, 256]), st.integers(0, 2100), st.data())
def test_pieces_overlapping_is_exactly_the_intersecting_pieces(
    size: int, piece: int, start: int, data: st.DataObject
) -> None:
    end = data.draw(st.integers(0, 2200))
    m = small_manifest(b"\0" * size, piece=piece)
    expected = [
        i
        for i in range(m.num_pieces)
        if start < end and m.piece_span(i)[0] < end and start < sum(m.piece_span(i))
    ]
    assert list(m.pieces_overlapping(start, end)) == expected


def test_pieces_overlapping_rejects_negative() -> None:
    with pytest.raises(ValueError):
        small_manifest(b"a" * 10).pieces_overlapping(-1, 5)


def test_piece_ok() -> None:
    data = bytes(range(50))
    m = small_manifest(data, piece=16)
    assert piece_ok(m, 0, data[:16])
    assert piece_ok(m, 3, data[48:])
    assert not piece_ok(m, 3, data[48:] + b"\0")  # right prefix, wrong length
    assert not piece_ok(m, 1, data[:16])
    assert not piece_ok(m, 4, b"")
    assert not piece_ok(m, -1, data[:16])


def test_file_checks(tmp_path: pytest.TempPathFactory) -> None:
    from pathlib import Path

    data = bytes(range(256)) * 4
    m = small_manifest(data, piece=64)
    path = Path(str(tmp_path)) / "f"
    path.write_bytes(data)
    assert file_sha256(path) == m.sha256
    assert bad_pieces(m, path) == []
    assert check_file(m, path).matches(m)
    corrupt = bytearray(data)
    corrupt[64 * 5 + 7] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    assert bad_pieces(m, path) == [5]
    assert check_file(m, path).bad_pieces == (5,)
    path.write_bytes(data[:200])  # truncated in piece 3
    assert bad_pieces(m, path) == list(range(3, 16))
    path.write_bytes(data + b"extra")
    assert bad_pieces(m, path) == []
    found = check_file(m, path)
    assert found.size_bytes == len(data) + 5 and not found.matches(m)


@given(st.binary(max_size=200))
def test_parse_torrent_only_raises_manifest_error(data: bytes) -> None:
    for candidate in (b"d4:info" + data, data):
        try:
            meta = parse_torrent(candidate)
        except ManifestError as err:
            assert str(err) and "\n" not in str(err)
        else:
            assert len(meta.info_hash) == 40 and meta.num_pieces >= 0


def test_parse_torrent_hashes_the_raw_info_bytes() -> None:
    info = b"d6:lengthi5e4:name5:a.pdf12:piece lengthi16384e6:pieces20:" + b"p" * 20 + b"e"
    data = b"d8:announce3:t/a4:info" + info + b"8:url-listl3:u/1ee"
    meta = parse_torrent(data)
    assert meta.info_hash == hashlib.sha1(info).hexdigest()
    assert (meta.name, meta.length, meta.piece_length, meta.num_pieces) == ("a.pdf", 5, 16384, 1)
    assert meta.web_seeds == ("u/1",) and meta.trackers == ("t/a",)
    for broken in (data[:-1], data + b"x", b"d4:infoi-0ee", b"d4:infoi01ee", b"l" * 100):
        with pytest.raises(ManifestError):
            parse_torrent(broken)
