"""``pressrun serve multicast``'s flags: bad input is a clear error and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from pressrun.cli import main
from pressrun.content.keys import generate_keypair


@pytest.fixture
def key(tmp_path: Path) -> Path:
    secret, _ = generate_keypair(tmp_path / "publisher.key")
    return secret


def _serve(tmp_path: Path, key: Path, *extra: str) -> list[str]:
    return [
        "serve",
        "multicast",
        "--content",
        str(tmp_path),
        "--key",
        str(key),
        "--control-group",
        "239.255.9.9:5400",
        *extra,
    ]


def test_no_token_is_refused(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRESSRUN_MULTICAST_TOKEN", raising=False)
    assert main(_serve(tmp_path, key)) == 2
    assert "no API token: set the environment variable PRESSRUN_MULTICAST_TOKEN" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--control-group", "10.1.2.3:5400"), "not a multicast address"),
        (("--control-group", "239.1.1.1"), "is not GROUP:PORT"),
        (("--channels", "0"), "channels must be 1..16"),
        (("--group-base", "192.168.1.1"), "not a multicast address"),
        (("--token-env", "PR_TEST_SHORT"), "at least 16 characters"),
        (("--start", "weekly-1=abc"), "the TSI after '=' must be a number"),
        (("--group-base", "239.255.255.200", "--group-count", "100"), "leaves the multicast"),
        (("--fdt-renew-s", "0"), "fdt_renew_s"),
    ],
)
def test_bad_flags_are_clear_errors(
    tmp_path: Path,
    key: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.setenv("PRESSRUN_MULTICAST_TOKEN", "a-token-of-20-chars!")
    monkeypatch.setenv("PR_TEST_SHORT", "short")
    assert main(_serve(tmp_path, key, *extra)) == 2
    assert message in capsys.readouterr().err


def test_a_missing_key_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRESSRUN_MULTICAST_TOKEN", "a-token-of-20-chars!")
    assert main(_serve(tmp_path, tmp_path / "missing.key")) == 2
    assert "missing.key" in capsys.readouterr().err
