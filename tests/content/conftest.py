"""Fixtures for content tests: a publisher key pair and a published bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
from published_bundle import PIECE, Published, make_issue

from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "publisher.key")


@pytest.fixture
def published(tmp_path: Path, keypair: tuple[Path, Path]) -> Published:
    source = tmp_path / "weekly-2026-47.pdf"
    data = make_issue(source, 3 * 1024 * 1024 + 12345)
    content = tmp_path / "content"
    bundle = publish(
        source,
        issue_id="weekly-2026-47",
        title="Weekly, issue 47",
        key_path=keypair[0],
        content_dir=content,
        web_seeds=["http://127.0.0.1:8001", "http://127.0.0.1:8002/"],
        trackers=["http://127.0.0.1:6969/announce"],
        piece_size=PIECE,
    )
    return Published(content, bundle, source, keypair[0], keypair[1], data)
