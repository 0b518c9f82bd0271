"""``pressrun keys new`` killed, or its disk full, at every step: the key pair the next
user of the key sees is the old pair or the new one, whole, never a 0-byte key and
never a secret key with another key's ``.pub``; a rerun ends with a good pair and no
leftover file."""

from __future__ import annotations

from pathlib import Path

import pytest
from crashpoint import Outcome, Zygote, fresh_copy, sweep

from pressrun.content.keys import (
    KeyFileError,
    generate_keypair,
    load_public_key,
    load_signing_key,
    load_subscriber_key,
)


def pair_as_used(secret: Path, subscriber: bool) -> bytes | None:
    """The public key of the pair as its next user sees it (loading the secret key
    finishes a pair a crash interrupted and refuses a mismatched one); None: no key."""
    if not secret.exists() and not secret.with_name(secret.name + ".pub").exists():
        return None
    if subscriber:
        public = bytes(load_subscriber_key(secret).public_key)
    else:
        public = bytes(load_signing_key(secret).verify_key)
    assert load_public_key(str(secret) + ".pub", "public key") == public
    return public


@pytest.mark.parametrize("subscriber", [False, True], ids=["publisher", "subscriber"])
@pytest.mark.parametrize("force", [True, False], ids=["force", "new"])
async def test_keys_new_at_every_step(tmp_path: Path, subscriber: bool, force: bool) -> None:
    template = tmp_path / "template"
    template.mkdir()
    if force:
        generate_keypair(template / "k.key", subscriber=subscriber)
    work = tmp_path / "work"
    secret = work / "k.key"
    argv = ["keys", "new", "--out", str(secret)]
    argv += ["--force"] if force else []
    argv += ["--subscriber"] if subscriber else []
    old = pair_as_used(template / "k.key", subscriber)

    async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
        if not outcome.killed:
            # a full disk: one clear line, exit 1 (or done, if the fault came late)
            assert outcome.rc in (0, 1), outcome.err
            if outcome.rc == 1:
                assert outcome.err.startswith("pressrun keys new: "), outcome.err
        if mode == "kill":
            # as the next publish or get would see it (the rerun does it itself in the
            # "enospc" sweep): the old pair or a whole new one
            try:
                now = pair_as_used(secret, subscriber)
            except KeyFileError as err:
                raise AssertionError(f"the key pair is broken: {err}") from None
            if old is not None:
                assert now is not None, "the old key pair is gone"
            if outcome.rc == 0:
                assert now is not None and now != old, "keys new said done, no new pair"

    async def rerun() -> None:
        again = await zygote.run(argv, cwd=work)
        if force or again.rc == 0:
            assert again.rc == 0, again.err
        else:  # the crash's pair was finished: `keys new` without --force refuses it
            assert again.rc == 1 and "already exists" in again.err, again.err
        assert pair_as_used(secret, subscriber) is not None
        assert sorted(p.name for p in work.iterdir()) == ["k.key", "k.key.pub"]

    async with Zygote(tmp_path / "zygote") as zygote:
        done = await sweep(
            zygote,
            argv,
            cwd=work,
            prepare=lambda: fresh_copy(template, work),
            after_crash=after_crash,
            rerun=rerun,
        )
    assert done.calls >= 8 and done.runs == 2 * done.calls
