"""Publisher and subscriber key files (docs/protocols.md, "Key files", "Subscriber keys").

``publisher.key`` holds the 32-byte Ed25519 secret seed as 64 hex characters
(mode 0600); ``publisher.key.pub`` holds the public key as 64 hex characters. A
subscriber's ``reader.key`` / ``reader.key.pub`` have the same layout with an X25519
key pair. All end with a newline; readers ignore surrounding whitespace.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nacl.public
import nacl.signing

from pressrun.content.codec import is_hex
from pressrun.durable import write_atomic

__all__ = [
    "KeyFileError",
    "generate_keypair",
    "load_public_key",
    "load_signing_key",
    "load_subscriber_key",
]

MAX_KEY_FILE_BYTES = 4096


class KeyFileError(Exception):
    """A key file that is missing, unreadable or not a pressrun key (one-line message)."""


def public_path_for(secret_path: Path) -> Path:
    """Where the public key of ``secret_path`` lives: the same name plus ``.pub``."""
    return secret_path.with_name(secret_path.name + ".pub")


def _write_text(path: Path, text: str, *, mode: int, force: bool) -> None:
    """Write ``text`` to ``path`` with ``mode`` from the first byte on.

    Without ``force`` the file is created exclusively (an existing one is an error);
    with it, a temp file in the same folder is renamed over the old one, so a crash
    leaves either the old key or the new one, never half of one.
    """
    data = text.encode("ascii")
    if not force:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    write_atomic(path, data, mode=mode)


def generate_keypair(
    out: Path, *, force: bool = False, subscriber: bool = False
) -> tuple[Path, Path]:
    """Make a new key pair: the secret in ``out`` (0600), the public key in ``out.pub``.

    A publisher's Ed25519 key pair, or with ``subscriber`` a reader's X25519 key pair
    (docs/protocols.md, "Subscriber keys and wraps"). Refuses (KeyFileError) to
    overwrite either file unless ``force``. Returns ``(secret_path, public_path)``.
    """
    out = Path(out)
    pub = public_path_for(out)
    if not force:
        for p in (out, pub):
            if p.exists():
                raise KeyFileError(
                    f"{p} already exists; pass --force to replace it "
                    "(anything signed with the old key will no longer match it)"
                )
    if not out.parent.is_dir():
        raise KeyFileError(f"folder {out.parent} does not exist")
    if subscriber:
        reader = nacl.public.PrivateKey.generate()
        secret, public = bytes(reader), bytes(reader.public_key)
    else:
        signer = nacl.signing.SigningKey.generate()
        secret, public = bytes(signer), bytes(signer.verify_key)
    try:
        _write_text(out, secret.hex() + "\n", mode=0o600, force=force)
        _write_text(pub, public.hex() + "\n", mode=0o644, force=force)
    except FileExistsError as err:
        raise KeyFileError(f"{err.filename} already exists; pass --force to replace it") from None
    except OSError as err:
        raise KeyFileError(f"could not write key file {out}: {err.strerror}") from None
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
    seed = _read_hex32(path, "secret key")
    return nacl.signing.SigningKey(seed)


def load_subscriber_key(path: Path | str) -> nacl.public.PrivateKey:
    """Read a subscriber's X25519 secret key file; KeyFileError (one line) if not one."""
    path = Path(path)
    try:
        secret = _read_hex32(path, "subscriber key")
    except KeyFileError as err:
        if not path.exists():
            raise KeyFileError(
                f"subscriber key file {path} does not exist (make one with `pressrun keys "
                "new --subscriber --out FILE` and give its .pub to the publisher)"
            ) from None
        raise err from None
    return nacl.public.PrivateKey(secret)


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
