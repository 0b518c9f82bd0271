"""Publisher and subscriber key files (docs/protocols.md, "Key files", "Subscriber keys").

``publisher.key`` holds the 32-byte Ed25519 secret seed as 64 hex characters
(mode 0600); ``publisher.key.pub`` holds the public key as 64 hex characters. A
subscriber's ``reader.key`` / ``reader.key.pub`` have the same layout with an X25519
key pair. All end with a newline; readers ignore surrounding whitespace.

A pair is written whole or not at all, and as a pair: ``keys new`` first writes both
keys to ``.<name>.new-pair`` beside them (one file, mode 0600, through a temp file and
a rename, fsynced), then each key file the same way, then removes it. A crash before
that file is whole changes nothing; after it, the next ``keys new`` or load of the key
(`finish_pending_pair`) writes the pair it holds and says so in the log. A secret key
whose ``.pub`` beside it is not its public half is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from pathlib import Path

import nacl.public
import nacl.signing

from pressrun.content.codec import is_hex
from pressrun.durable import fsync_dir, write_atomic

__all__ = [
    "KeyFileError",
    "generate_keypair",
    "load_public_key",
    "load_signing_key",
    "load_subscriber_key",
]

MAX_KEY_FILE_BYTES = 4096

log = logging.getLogger(__name__)


class KeyFileError(Exception):
    """A key file that is missing, unreadable or not a pressrun key (one-line message)."""


def public_path_for(secret_path: Path) -> Path:
    """Where the public key of ``secret_path`` lives: the same name plus ``.pub``."""
    return secret_path.with_name(secret_path.name + ".pub")


def pending_path_for(secret_path: Path) -> Path:
    """Where a pair being written waits: ``.<name>.new-pair`` beside the secret key."""
    return secret_path.with_name(f".{secret_path.name}.new-pair")


def _write_pair(out: Path, secret: bytes, public: bytes) -> None:
    """Write both key files from the pending pair file (which must already be whole)."""
    write_atomic(out, secret.hex().encode("ascii") + b"\n", mode=0o600)
    write_atomic(public_path_for(out), public.hex().encode("ascii") + b"\n", mode=0o644)
    os.unlink(pending_path_for(out))
    fsync_dir(out.parent)


def _remove_temps(out: Path) -> None:
    """Temp files a crash left beside the key files (``write_atomic``'s ``.<name>.*``)."""
    names = (out.name, public_path_for(out).name, pending_path_for(out).name)
    temp = re.compile("|".join(rf"\.{re.escape(n)}\.[a-z0-9_]{{8}}" for n in names))
    for leftover in out.parent.iterdir():
        if temp.fullmatch(leftover.name) and leftover.is_file():
            with contextlib.suppress(OSError):
                leftover.unlink()


def finish_pending_pair(out: Path, *, clean_temps: bool = False) -> bool:
    """Finish a key pair a crash left half-written at ``out``; True if there was one.

    A whole pending pair file (both keys, the public one the secret's own half) is
    written out; a torn one (it cannot be: it is renamed in whole) is removed.
    ``clean_temps`` (``keys new``) also removes the temp files of an interrupted
    write. KeyFileError when the pair cannot be written now.
    """
    out = Path(out)
    pending = pending_path_for(out)
    if clean_temps:
        with contextlib.suppress(OSError):
            _remove_temps(out)
    try:
        fields = pending.read_text("ascii").split()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        fields = []
    pair = _pair_from(fields)
    try:
        if pair is None:
            pending.unlink()
            log.warning("removed %s: not a whole key pair (the old key files stay)", pending)
            return False
        _write_pair(out, *pair)
    except OSError as err:
        raise KeyFileError(
            f"a new key pair for {out} was being written when pressrun stopped and it "
            f"cannot be finished now: {err.strerror or err}"
        ) from None
    log.warning(
        "finished writing the key pair %s and %s (a crash had interrupted it)",
        out,
        public_path_for(out),
    )
    return True


def _pair_from(fields: list[str]) -> tuple[bytes, bytes] | None:
    """(secret, public) from a pending pair file's words, if they are a real pair."""
    if len(fields) != 3 or fields[0] not in ("ed25519", "x25519"):
        return None
    if not (is_hex(fields[1], 64) and is_hex(fields[2], 64)):
        return None
    secret, public = bytes.fromhex(fields[1]), bytes.fromhex(fields[2])
    if _public_of(secret, subscriber=fields[0] == "x25519") != public:
        return None
    return secret, public


def _public_of(secret: bytes, *, subscriber: bool) -> bytes:
    if subscriber:
        return bytes(nacl.public.PrivateKey(secret).public_key)
    return bytes(nacl.signing.SigningKey(secret).verify_key)


def generate_keypair(
    out: Path, *, force: bool = False, subscriber: bool = False
) -> tuple[Path, Path]:
    """Make a new key pair: the secret in ``out`` (0600), the public key in ``out.pub``.

    A publisher's Ed25519 key pair, or with ``subscriber`` a reader's X25519 key pair
    (docs/protocols.md, "Subscriber keys and wraps"). Refuses (KeyFileError) to
    overwrite either file unless ``force``. Written whole or not at all, as a pair
    (module docstring). Returns ``(secret_path, public_path)``.
    """
    out = Path(out)
    pub = public_path_for(out)
    if not out.parent.is_dir():
        raise KeyFileError(f"folder {out.parent} does not exist")
    finish_pending_pair(out, clean_temps=True)
    if not force:
        for p in (out, pub):
            if p.exists():
                raise KeyFileError(
                    f"{p} already exists; pass --force to replace it "
                    "(anything signed with the old key will no longer match it)"
                )
    if subscriber:
        reader = nacl.public.PrivateKey.generate()
        secret, public = bytes(reader), bytes(reader.public_key)
    else:
        signer = nacl.signing.SigningKey.generate()
        secret, public = bytes(signer), bytes(signer.verify_key)
    kind = "x25519" if subscriber else "ed25519"
    try:
        # the pair is decided once this file is whole (a rename), before either key file
        write_atomic(
            pending_path_for(out), f"{kind} {secret.hex()} {public.hex()}\n".encode(), mode=0o600
        )
    except OSError as err:
        raise KeyFileError(f"could not write key file {out}: {err.strerror}") from None
    try:
        _write_pair(out, secret, public)
    except OSError as err:
        raise KeyFileError(
            f"could not write key file {out}: {err.strerror}; the new pair is kept in "
            f"{pending_path_for(out)} and written by the next `pressrun keys new --out "
            f"{out}` or use of the key"
        ) from None
    return out, pub


def _read_hex32(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        hint = " (make one with `pressrun keys new --out FILE`)" if what == "secret key" else ""
        raise KeyFileError(f"{what} file {path} does not exist{hint}") from None
    except IsADirectoryError:
        raise KeyFileError(f"{what} file {path} is a folder, not a key file") from None
    except OSError as err:
        raise KeyFileError(f"cannot read {what} file {path}: {err.strerror}") from None
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if len(raw) > MAX_KEY_FILE_BYTES or not is_hex(text.lower(), 64):
        raise KeyFileError(f"{path} is not a pressrun {what} file (expected 64 hex characters)")
    return bytes.fromhex(text)


def load_signing_key(path: Path | str) -> nacl.signing.SigningKey:
    """Read a publisher's secret key file; KeyFileError with a one-line message if not one."""
    path = Path(path)
    finish_pending_pair(path)
    seed = _read_hex32(path, "secret key")
    key = nacl.signing.SigningKey(seed)
    _check_pair(path, bytes(key.verify_key))
    return key


def load_subscriber_key(path: Path | str) -> nacl.public.PrivateKey:
    """Read a subscriber's X25519 secret key file; KeyFileError (one line) if not one."""
    path = Path(path)
    finish_pending_pair(path)
    try:
        secret = _read_hex32(path, "subscriber key")
    except KeyFileError as err:
        if not path.exists():
            raise KeyFileError(
                f"subscriber key file {path} does not exist (make one with `pressrun keys "
                "new --subscriber --out FILE` and give its .pub to the publisher)"
            ) from None
        raise err from None
    key = nacl.public.PrivateKey(secret)
    _check_pair(path, bytes(key.public_key))
    return key


def _check_pair(secret_path: Path, public: bytes) -> None:
    """KeyFileError if the ``.pub`` beside ``secret_path`` is not ``public``."""
    pub = public_path_for(secret_path)
    try:
        found = _read_hex32(pub, "public key")
    except KeyFileError:
        if not pub.exists():
            return  # a secret key alone is fine
        raise
    if found != public:
        raise KeyFileError(
            f"{pub} is not the public key of {secret_path} (a mismatched pair: readers "
            f"would reject what it signs); make a new pair with `pressrun keys new --out "
            f"{secret_path} --force`"
        )


def load_public_key(path_or_hex: str | Path, what: str = "publisher key") -> bytes:
    """A public key (``what``: a publisher's by default, or a subscriber's) from 64 hex
    characters or a ``.pub`` file; 32 bytes.

    Raises KeyFileError (one line) when it is neither. A secret key file given by
    mistake (``X`` where ``X.pub`` exists) is refused rather than silently trusted as
    a public key it is not.
    """
    s = str(path_or_hex).strip()
    if is_hex(s.lower(), 64) and not Path(s).exists():
        return bytes.fromhex(s)
    path = Path(s)
    if not path.exists():
        raise KeyFileError(f"{what} {s!r} is neither 64 hex characters nor an existing .pub file")
    if public_path_for(path).exists() and path.suffix != ".pub":
        raise KeyFileError(
            f"{path} looks like a secret key (its {public_path_for(path).name} is beside it); "
            "pass the .pub file"
        )
    return _read_hex32(path, "public key")


def is_private_mode(path: Path) -> bool:
    """True if nobody but the owner can read ``path`` (what a secret key needs)."""
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
