"""``pressrun trust add|list``: the documented way to trust a publisher key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pressrun.cli import main
from pressrun.clients.library import Library
from pressrun.content.keys import generate_keypair, load_public_key


def test_trust_add_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, pub = generate_keypair(tmp_path / "publisher.key")
    key = load_public_key(pub)
    library = tmp_path / "lib"
    assert main(["trust", "list", "--library", str(library)]) == 0
    assert "no trusted publisher key" in capsys.readouterr().err
    assert main(["trust", "add", str(pub), "--library", str(library), "--note", "Weekly"]) == 0
    assert f"trusted: {key.hex()}" in capsys.readouterr().out
    assert Library(library).trusted_keys() == {key}
    assert "# Weekly" in (library / "trusted-publishers").read_text()
    assert main(["trust", "add", key.hex(), "--library", str(library)]) == 0
    assert "already trusted" in capsys.readouterr().out
    assert main(["trust", "list", "--library", str(library)]) == 0
    assert capsys.readouterr().out.split() == [key.hex()]
    assert main(["trust", "add", "not-a-key", "--library", str(library)]) == 2
    assert "publisher key 'not-a-key' is neither" in capsys.readouterr().err
