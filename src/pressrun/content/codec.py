"""Bytes <-> issue metadata: the signed manifest's JSON and the torrent's bencode.

Pure: hashlib, json, re and ``pressrun.bencode`` only; no file, socket, clock or crypto
library. Everything that reads a file or checks a signature lives in ``manifest.py`` /
``bundle.py`` and calls into here, so the simulator and the clients' piece checks can
use the same definitions without touching the disk.

The contract these functions implement is docs/protocols.md ("Signed manifest"):

- the manifest is a JSON object with exactly the format-1 fields;
- the signature covers its canonical bytes,
  ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
  encoded as UTF-8; so parsing a manifest and re-serialising it must give back the
  same value for every field, which is why the parser refuses anything it could not
  reproduce (unknown fields, floats for integers, upper-case hex);
- pieces are the torrent's pieces: ``piece_size_bytes`` each, the last one shorter;
- an encrypted issue (docs/protocols.md, "Encrypted issues") adds an ``encryption``
  object; every other field then describes the ciphertext file, and this module also
  lays out each piece's nonce and associated data byte by byte (the AEAD itself is
  in ``encryption.py``, it needs libsodium).

The torrent side reads a torrent with ``pressrun.bencode`` and takes the ``info``
dictionary's SHA-1 (the v1 info-hash) and the few fields a bundle check compares.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from pressrun.bencode import BencodeError, bdecode, bencode

FORMAT = 1
# docs/protocols.md: issue ids and bundle file names.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
CREATED_AT_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
MAX_TITLE_CHARS = 1000
#: the publisher's piece size: 128 KiB. A piece is passed on only once whole (its hash
#: checked), so each hop of the swarm holds it for a piece's time at the uploader's
#: rate, and a crowd's first pieces from one capped origin arrive together after
#: (peers x piece) / origin rate; halving the piece halves both. Measured on the
#: loopback swarm (docs/publishing.md, docs/chord.md "Benches")
DEFAULT_PIECE_SIZE = 131072

_FIELDS = (
    "format",
    "issue_id",
    "title",
    "file_name",
    "size_bytes",
    "piece_size_bytes",
    "piece_sha256",
    "sha256",
    "info_hash",
    "publisher_key",
    "created_at",
)


# docs/protocols.md, "Encrypted issues": the one encryption scheme and its constants.
ENCRYPTION_SCHEME = "xchacha20poly1305-pieces-v1"
AEAD_TAG_BYTES = 16  # Poly1305 tag appended to every piece
NONCE_PREFIX_BYTES = 16  # random per issue version; + 8 bytes of piece index = 24
AD_MAGIC = b"pressrun-piece-v1"
KEY_CHECK_MESSAGE = b"pressrun-key-check-v1"
MAX_URL_CHARS = 2000
MAX_TORRENT_DEPTH = 32  # a torrent nests four levels; deeper is refused
_ENCRYPTION_FIELDS = (
    "scheme",
    "version",
    "nonce_prefix",
    "key_check",
    "plain_file_name",
    "plain_size_bytes",
    "plain_sha256",
    "subscriptions_url",
)


class ManifestError(Exception):
    """A manifest (or the bundle around it) that cannot be trusted or used.

    The message is one line a person understands, ready to print after the
    command name.
    """


def valid_issue_id(s: str) -> bool:
    """True if ``s`` may be an issue id (``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``)."""
    return NAME_RE.fullmatch(s) is not None


def valid_file_name(s: str) -> bool:
    """True if ``s`` may name a file in a bundle (same rule as issue ids)."""
    return NAME_RE.fullmatch(s) is not None


def is_hex(s: str, n_chars: int) -> bool:
    """True if ``s`` is exactly ``n_chars`` lower-case hex digits."""
    return len(s) == n_chars and all(c in "0123456789abcdef" for c in s)


def num_pieces_for(size_bytes: int, piece_size_bytes: int) -> int:
    """How many pieces of ``piece_size_bytes`` (the last shorter) cover ``size_bytes``."""
    return -(-size_bytes // piece_size_bytes)


@dataclass(frozen=True)
class Encryption:
    """The ``encryption`` object of an encrypted issue's manifest (docs/protocols.md).

    ``nonce_prefix`` (16 bytes) and ``key_check`` (32 bytes) are raw bytes here and
    lower-case hex in the JSON.
    """

    scheme: str
    version: int
    nonce_prefix: bytes
    key_check: bytes
    plain_file_name: str
    plain_size_bytes: int
    plain_sha256: str
    subscriptions_url: str
    # the embargo (issue 35): no wrap is handed out before this UTC time
    # ("2026-11-28T06:00:00Z"); absent from the JSON when None
    release_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The object as it appears in the manifest's JSON."""
        d: dict[str, Any] = {
            "scheme": self.scheme,
            "version": self.version,
            "nonce_prefix": self.nonce_prefix.hex(),
            "key_check": self.key_check.hex(),
            "plain_file_name": self.plain_file_name,
            "plain_size_bytes": self.plain_size_bytes,
            "plain_sha256": self.plain_sha256,
            "subscriptions_url": self.subscriptions_url,
        }
        if self.release_at is not None:
            d["release_at"] = self.release_at
        return d


def plain_piece_size(piece_size_bytes: int) -> int:
    """Plaintext bytes in a full piece of an encrypted issue: the piece less its tag."""
    return piece_size_bytes - AEAD_TAG_BYTES


def encrypted_size(plain_size_bytes: int, piece_size_bytes: int) -> int:
    """Size of the ciphertext file: the plaintext plus one 16-byte tag per piece."""
    pieces = num_pieces_for(plain_size_bytes, plain_piece_size(piece_size_bytes))
    return plain_size_bytes + AEAD_TAG_BYTES * pieces


def piece_nonce(nonce_prefix: bytes, index: int) -> bytes:
    """The 24-byte XChaCha20 nonce of piece ``index``: prefix || u64 big-endian index."""
    if len(nonce_prefix) != NONCE_PREFIX_BYTES:
        raise ValueError(f"nonce prefix must be {NONCE_PREFIX_BYTES} bytes")
    return nonce_prefix + struct.pack(">Q", index)


def piece_associated_data(
    issue_id: str, version: int, index: int, piece_count: int, plain_size_bytes: int
) -> bytes:
    """The associated data of piece ``index`` (docs/protocols.md, byte by byte).

    ``"pressrun-piece-v1"`` (17 ASCII bytes) || u8 length of the issue id || the
    issue id (ASCII) || u64 version || u64 index || u64 piece count || u64 plaintext
    size of the whole file; integers big-endian.
    """
    name = issue_id.encode("ascii")
    if not 1 <= len(name) <= 255:
        raise ValueError("issue id must be 1 to 255 ASCII bytes")
    return (
        AD_MAGIC
        + struct.pack(">B", len(name))
        + name
        + struct.pack(">QQQQ", version, index, piece_count, plain_size_bytes)
    )


@dataclass(frozen=True)
class Manifest:
    """What the publisher signs about one issue (docs/protocols.md, format 1).

    Construct it through :func:`manifest_from_dict` (or
    ``SignedManifest.from_json_bytes``) when the data comes from outside: the
    constructor itself does not validate.
    """

    format: int
    issue_id: str
    title: str
    file_name: str
    size_bytes: int
    piece_size_bytes: int
    piece_sha256: tuple[str, ...]
    sha256: str
    info_hash: str
    publisher_key: str
    created_at: str
    # None: a plain issue. Set: every field above describes the ciphertext file.
    encryption: Encryption | None = None

    def to_dict(self) -> dict[str, Any]:
        """The manifest as the JSON object of the contract (piece hashes as a list)."""
        d = {
            "format": self.format,
            "issue_id": self.issue_id,
            "title": self.title,
            "file_name": self.file_name,
            "size_bytes": self.size_bytes,
            "piece_size_bytes": self.piece_size_bytes,
            "piece_sha256": list(self.piece_sha256),
            "sha256": self.sha256,
            "info_hash": self.info_hash,
            "publisher_key": self.publisher_key,
            "created_at": self.created_at,
        }
        if self.encryption is not None:
            d["encryption"] = self.encryption.to_dict()
        return d

    def canonical_bytes(self) -> bytes:
        """The exact bytes the Ed25519 signature covers."""
        return canonical_json(self.to_dict())

    @property
    def num_pieces(self) -> int:
        """Number of pieces (the torrent's piece count)."""
        return len(self.piece_sha256)

    @property
    def publisher_key_bytes(self) -> bytes:
        """The publisher's 32-byte Ed25519 public key."""
        return bytes.fromhex(self.publisher_key)

    def piece_span(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of piece ``index`` in the file; IndexError outside."""
        if not 0 <= index < self.num_pieces:
            raise IndexError(f"piece {index} out of range 0..{self.num_pieces - 1}")
        offset = index * self.piece_size_bytes
        return offset, min(self.piece_size_bytes, self.size_bytes - offset)

    def pieces_overlapping(self, start: int, end: int) -> range:
        """Indices of the pieces that intersect the byte range ``[start, end)``.

        The range is clipped to the file; an empty or inverted range gives an empty
        ``range``. Useful for "which pieces does this HTTP Range touch".
        """
        if start < 0 or end < 0:
            raise ValueError(f"byte range [{start}, {end}) has a negative bound")
        end = min(end, self.size_bytes)
        if start >= end:
            return range(0)
        return range(start // self.piece_size_bytes, num_pieces_for(end, self.piece_size_bytes))

    def plain_span(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of piece ``index``'s plaintext in the decrypted file.

        Only for an encrypted issue (ValueError otherwise); IndexError outside.
        """
        if self.encryption is None:
            raise ValueError(f"issue {self.issue_id} is not encrypted")
        if not 0 <= index < self.num_pieces:
            raise IndexError(f"piece {index} out of range 0..{self.num_pieces - 1}")
        chunk = plain_piece_size(self.piece_size_bytes)
        offset = index * chunk
        return offset, min(chunk, self.encryption.plain_size_bytes - offset)

    def associated_data(self, index: int) -> bytes:
        """The associated data of piece ``index`` of this encrypted issue."""
        if self.encryption is None:
            raise ValueError(f"issue {self.issue_id} is not encrypted")
        return piece_associated_data(
            self.issue_id,
            self.encryption.version,
            index,
            self.num_pieces,
            self.encryption.plain_size_bytes,
        )


def canonical_json(obj: dict[str, Any]) -> bytes:
    """The canonical encoding of docs/protocols.md: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def piece_ok(manifest: Manifest, index: int, data: bytes) -> bool:
    """True if ``data`` is exactly piece ``index`` as the manifest names it.

    An index outside the file is simply not OK (a peer may claim anything).
    """
    if not 0 <= index < manifest.num_pieces:
        return False
    _, length = manifest.piece_span(index)
    return len(data) == length and hashlib.sha256(data).hexdigest() == manifest.piece_sha256[index]


def _want_int(d: dict[str, Any], key: str, *, minimum: int) -> int:
    v = d[key]
    # bool is an int in Python but not in JSON; 1.0 would re-serialise as "1.0".
    if type(v) is not int:
        raise ManifestError(f"manifest field {key} must be an integer, not {_json_type(v)}")
    if v < minimum:
        raise ManifestError(f"manifest field {key} must be at least {minimum}, not {v}")
    return v


def _want_str(d: dict[str, Any], key: str) -> str:
    v = d[key]
    if not isinstance(v, str):
        raise ManifestError(f"manifest field {key} must be a string, not {_json_type(v)}")
    return v


def _want_hex(d: dict[str, Any], key: str, n_chars: int) -> str:
    v = _want_str(d, key)
    if not is_hex(v, n_chars):
        raise ManifestError(f"manifest field {key} must be {n_chars} lower-case hex digits")
    return v


def _json_type(v: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if v is None:
        return "null"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return names.get(type(v), type(v).__name__)


def manifest_from_dict(d: object) -> Manifest:
    """Validate a decoded ``manifest`` object and build the :class:`Manifest`.

    Raises ManifestError (one line) on a missing or unknown field, a wrong type, bad
    hex, a bad name, or a piece list that does not fit size and piece size.
    """
    if not isinstance(d, dict):
        raise ManifestError(f"manifest must be a JSON object, not {_json_type(d)}")
    missing = [k for k in _FIELDS if k not in d]
    if missing:
        raise ManifestError(f"manifest is missing field(s): {', '.join(missing)}")
    unknown = sorted(str(k) for k in d if k not in (*_FIELDS, "encryption"))
    if unknown:
        raise ManifestError(f"manifest has unknown field(s): {', '.join(unknown)}")
    fmt = _want_int(d, "format", minimum=0)
    if fmt != FORMAT:
        raise ManifestError(
            f"manifest format {fmt} is not supported (this pressrun reads format {FORMAT})"
        )
    issue_id = _want_str(d, "issue_id")
    if not valid_issue_id(issue_id):
        raise ManifestError(f"manifest issue_id {issue_id!r} is not a valid issue id")
    title = _want_str(d, "title")
    if len(title) > MAX_TITLE_CHARS:
        raise ManifestError(f"manifest title is longer than {MAX_TITLE_CHARS} characters")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError("manifest title is not valid Unicode (lone surrogate)") from None
    file_name = _want_str(d, "file_name")
    if not valid_file_name(file_name):
        raise ManifestError(f"manifest file_name {file_name!r} is not a valid file name")
    size_bytes = _want_int(d, "size_bytes", minimum=1)
    piece_size = _want_int(d, "piece_size_bytes", minimum=1)
    raw_pieces = d["piece_sha256"]
    if not isinstance(raw_pieces, list):
        raise ManifestError(
            f"manifest field piece_sha256 must be a list, not {_json_type(raw_pieces)}"
        )
    expected = num_pieces_for(size_bytes, piece_size)
    if len(raw_pieces) != expected:
        raise ManifestError(
            f"manifest lists {len(raw_pieces)} piece hashes but {size_bytes} bytes in "
            f"pieces of {piece_size} make {expected}"
        )
    for i, h in enumerate(raw_pieces):
        if not isinstance(h, str) or not is_hex(h, 64):
            raise ManifestError(f"manifest piece_sha256[{i}] is not 64 lower-case hex digits")
    created_at = _want_str(d, "created_at")
    if not CREATED_AT_RE.fullmatch(created_at):
        raise ManifestError(
            f"manifest created_at {created_at!r} is not a UTC time like 2026-11-22T20:00:00Z"
        )
    encryption = None
    if "encryption" in d:
        encryption = encryption_from_dict(d["encryption"], size_bytes, piece_size)
    return Manifest(
        format=fmt,
        issue_id=issue_id,
        title=title,
        file_name=file_name,
        size_bytes=size_bytes,
        piece_size_bytes=piece_size,
        piece_sha256=tuple(raw_pieces),
        sha256=_want_hex(d, "sha256", 64),
        info_hash=_want_hex(d, "info_hash", 40),
        publisher_key=_want_hex(d, "publisher_key", 64),
        created_at=created_at,
        encryption=encryption,
    )


def encryption_from_dict(d: object, size_bytes: int, piece_size_bytes: int) -> Encryption:
    """Validate a manifest's ``encryption`` object against the ciphertext's size.

    The ciphertext must be exactly the plaintext plus one tag per piece, in pieces
    of ``piece_size_bytes`` (plaintext chunks of ``piece_size_bytes - 16``).
    """
    if not isinstance(d, dict):
        raise ManifestError(f"manifest field encryption must be an object, not {_json_type(d)}")
    missing = [k for k in _ENCRYPTION_FIELDS if k not in d]
    if missing:
        raise ManifestError(f"manifest encryption is missing field(s): {', '.join(missing)}")
    unknown = sorted(str(k) for k in d if k not in (*_ENCRYPTION_FIELDS, "release_at"))
    if unknown:
        raise ManifestError(f"manifest encryption has unknown field(s): {', '.join(unknown)}")
    scheme = _want_str(d, "scheme")
    if scheme != ENCRYPTION_SCHEME:
        raise ManifestError(
            f"manifest encryption scheme {scheme!r} is not supported (this pressrun reads "
            f"{ENCRYPTION_SCHEME!r})"
        )
    version = _want_int(d, "version", minimum=1)
    if version >= 1 << 63:
        raise ManifestError("manifest encryption version is too large")
    plain_name = _want_str(d, "plain_file_name")
    if not valid_file_name(plain_name):
        raise ManifestError(
            f"manifest encryption plain_file_name {plain_name!r} is not a valid file name"
        )
    plain_size = _want_int(d, "plain_size_bytes", minimum=1)
    if piece_size_bytes <= AEAD_TAG_BYTES:
        raise ManifestError(
            f"an encrypted issue needs pieces larger than {AEAD_TAG_BYTES} bytes, "
            f"not {piece_size_bytes}"
        )
    want = encrypted_size(plain_size, piece_size_bytes)
    if size_bytes != want:
        raise ManifestError(
            f"manifest size_bytes {size_bytes} is not the ciphertext size of "
            f"{plain_size} plaintext bytes in pieces of {piece_size_bytes} ({want})"
        )
    url = _want_str(d, "subscriptions_url")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url) or len(url) > MAX_URL_CHARS:
        raise ManifestError(
            f"manifest encryption subscriptions_url {url[:80]!r} is not an http(s) base URL"
        )
    release_at = None
    if "release_at" in d:
        release_at = _want_str(d, "release_at")
        if not CREATED_AT_RE.fullmatch(release_at):
            raise ManifestError(
                f"manifest encryption release_at {release_at[:40]!r} is not a UTC time like "
                "2026-11-28T06:00:00Z"
            )
    return Encryption(
        scheme=scheme,
        version=version,
        nonce_prefix=bytes.fromhex(_want_hex(d, "nonce_prefix", 2 * NONCE_PREFIX_BYTES)),
        key_check=bytes.fromhex(_want_hex(d, "key_check", 64)),
        plain_file_name=plain_name,
        plain_size_bytes=plain_size,
        plain_sha256=_want_hex(d, "plain_sha256", 64),
        subscriptions_url=url,
        release_at=release_at,
    )


def decode_signed(data: bytes) -> tuple[Manifest, bytes]:
    """Parse ``manifest.json`` bytes into the manifest and the 64-byte signature.

    Checks the shape only; the signature itself is checked by
    ``SignedManifest.verify`` (it needs the crypto library).
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError("manifest.json is not UTF-8 text") from None
    except ValueError as err:  # json.JSONDecodeError, RecursionError-free for depth
        raise ManifestError(f"manifest.json is not valid JSON ({err})") from None
    except RecursionError:
        raise ManifestError("manifest.json is nested too deeply") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"manifest.json must hold a JSON object, not {_json_type(doc)}")
    missing = [k for k in ("manifest", "signature") if k not in doc]
    if missing:
        raise ManifestError(f"manifest.json is missing {' and '.join(missing)}")
    unknown = sorted(str(k) for k in doc if k not in ("manifest", "signature"))
    if unknown:
        raise ManifestError(f"manifest.json has unknown field(s): {', '.join(unknown)}")
    manifest = manifest_from_dict(doc["manifest"])
    sig = doc["signature"]
    if not isinstance(sig, str) or not is_hex(sig, 128):
        raise ManifestError("manifest signature must be 128 lower-case hex digits")
    return manifest, bytes.fromhex(sig)


def encode_signed(manifest: Manifest, signature: bytes) -> bytes:
    """``manifest.json`` bytes: indented for people, newline-terminated.

    The layout does not matter to verification, which re-derives the canonical bytes.
    """
    doc = {"manifest": manifest.to_dict(), "signature": signature.hex()}
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# --- Torrent files (BEP 3 bencode), only what a bundle check needs ------------------


@dataclass(frozen=True)
class TorrentMeta:
    """The fields of a single-file v1 torrent that a bundle check compares."""

    info_hash: str  # 40 hex: SHA-1 of the raw bencoded info dictionary
    name: str
    length: int
    piece_length: int
    num_pieces: int
    web_seeds: tuple[str, ...]
    trackers: tuple[str, ...]


def parse_torrent(data: bytes) -> TorrentMeta:
    """Read a single-file v1 torrent; ManifestError if it is not one.

    The info-hash is the SHA-1 of the info dictionary's bytes exactly as they appear
    in the file (BEP 3): ``pressrun.bencode`` accepts canonical bencode only, so the
    info dictionary re-encodes to exactly those bytes.
    """
    try:
        top = bdecode(data, max_depth=MAX_TORRENT_DEPTH)
    except BencodeError as err:
        raise ManifestError(f"torrent file is not canonical bencode: {err}") from None
    if not isinstance(top, dict):
        raise ManifestError("torrent file is not a bencoded dictionary")
    if b"info" not in top:
        raise ManifestError("torrent file has no info dictionary")
    info = top[b"info"]
    if not isinstance(info, dict):
        raise ManifestError("torrent info is not a dictionary")
    name, length, plen, pieces = (
        info.get(b"name"),
        info.get(b"length"),
        info.get(b"piece length"),
        info.get(b"pieces"),
    )
    if not (
        isinstance(name, bytes)
        and isinstance(length, int)
        and isinstance(plen, int)
        and isinstance(pieces, bytes)
    ):
        raise ManifestError("torrent is not a single-file v1 torrent (name/length/pieces)")
    if len(pieces) % 20:
        raise ManifestError("torrent piece list is not a whole number of SHA-1 hashes")
    url_list = top.get(b"url-list", [])
    seeds = [url_list] if isinstance(url_list, bytes) else url_list
    trackers: list[bytes] = []
    announce = top.get(b"announce")
    if isinstance(announce, bytes):
        trackers.append(announce)
    tiers = top.get(b"announce-list")
    if isinstance(tiers, list):
        for tier in tiers:
            if isinstance(tier, list):
                trackers.extend(t for t in tier if isinstance(t, bytes) and t not in trackers)
    return TorrentMeta(
        info_hash=hashlib.sha1(bencode(info)).hexdigest(),
        name=name.decode("utf-8", "replace"),
        length=length,
        piece_length=plen,
        num_pieces=len(pieces) // 20,
        web_seeds=tuple(s.decode("utf-8", "replace") for s in seeds if isinstance(s, bytes))
        if isinstance(seeds, list)
        else (),
        trackers=tuple(t.decode("utf-8", "replace") for t in trackers),
    )
