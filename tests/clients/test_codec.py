"""Directive JSON and the resume state file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pressrun.clients.codec import (
    DirectiveFormatError,
    DirectiveOrigin,
    DirectiveSwarm,
    ResumeState,
    decode_directive,
    decode_error,
)

DIRECTIVE = {
    "issue_id": "weekly-2026-47",
    "mode": "origin",
    "origins": [
        {"name": "origin-a", "url": "http://127.0.0.1:8001/", "score": 2950.0},
        {"name": "origin-c", "url": "http://127.0.0.1:8003", "score": None},
    ],
    "swarm": None,
    "fallbacks": ["origin"],
    "expires_in_s": 5.0,
    "algorithm": "alg2",
}


def test_directive_of_the_protocol_page() -> None:
    d = decode_directive(json.dumps(DIRECTIVE).encode())
    assert d.issue_id == "weekly-2026-47" and d.mode == "origin"
    assert d.origins == (
        DirectiveOrigin("origin-a", "http://127.0.0.1:8001"),
        DirectiveOrigin("origin-c", "http://127.0.0.1:8003"),
    )
    assert d.expires_in_s == 5.0


SWARM = {
    "torrent_url": "http://127.0.0.1:8001/content/weekly-2026-47/weekly-2026-47.torrent",
    "tracker_url": "http://127.0.0.1:6969/announce",
    "info_hash": "ab" * 20,
}


def test_swarm_directive() -> None:
    doc = {**DIRECTIVE, "mode": "swarm", "swarm": SWARM, "fallbacks": ["origin"]}
    d = decode_directive(json.dumps(doc).encode())
    assert d.mode == "swarm"
    assert d.swarm == DirectiveSwarm(SWARM["torrent_url"], SWARM["tracker_url"], "ab" * 20)
    assert decode_directive(json.dumps(DIRECTIVE).encode()).swarm is None


def test_an_origin_directive_names_the_swarm_its_copy_seeds() -> None:
    # not a swarm to download from (the reader stays on the origins): one to seed
    d = decode_directive(json.dumps({**DIRECTIVE, "swarm": SWARM}).encode())
    assert d.mode == "origin" and d.swarm is None
    assert d.seed_swarm == DirectiveSwarm(SWARM["torrent_url"], SWARM["tracker_url"], "ab" * 20)
    assert decode_directive(json.dumps(DIRECTIVE).encode()).seed_swarm is None
    swarm_mode = {**DIRECTIVE, "mode": "swarm", "swarm": SWARM, "fallbacks": ["origin"]}
    assert decode_directive(json.dumps(swarm_mode).encode()).seed_swarm is None


BAD_SWARMS = ["x", {**SWARM, "info_hash": None}, {**SWARM, "torrent_url": "file:///etc/passwd"}]


@pytest.mark.parametrize(
    ("mode", "swarm"),
    # an origin directive may have none (the protocol page's), a swarm one must
    [("swarm", None)] + [(mode, bad) for mode in ("swarm", "origin") for bad in BAD_SWARMS],
)
def test_malformed_swarm_directives(mode: str, swarm: object) -> None:
    doc = {**DIRECTIVE, "mode": mode, "swarm": swarm}
    with pytest.raises(DirectiveFormatError):
        decode_directive(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "change",
    [
        {"origins": "x"},
        {"origins": [{"name": "a"}]},
        {"origins": [{"name": "a", "url": "ftp://x"}]},
        {"mode": 3},
        {"expires_in_s": True},
    ],
)
def test_malformed_directives(change: dict[str, object]) -> None:
    with pytest.raises(DirectiveFormatError):
        decode_directive(json.dumps({**DIRECTIVE, **change}).encode())
    with pytest.raises(DirectiveFormatError):
        decode_directive(b"<html>")


def test_error_body() -> None:
    assert decode_error(b'{"error": "no origin holds\\n issue x"}') == "no origin holds issue x"
    assert decode_error(b"oops") is None


@given(st.frozensets(st.integers(min_value=0, max_value=10_000)))
def test_resume_state_round_trip(verified: frozenset[int]) -> None:
    state = ResumeState("i", "i.pdf", "ab" * 32, 123456, 65536, verified)
    assert ResumeState.from_json_bytes(state.to_json_bytes()) == state
    assert state.matches("i", "i.pdf", "ab" * 32, 123456, 65536)
    assert not state.matches("i", "i.pdf", "cd" * 32, 123456, 65536)


def test_unreadable_state_is_none() -> None:
    assert ResumeState.from_json_bytes(b"{") is None
    assert ResumeState.from_json_bytes(b'{"format": 2}') is None
    assert ResumeState.from_json_bytes(b'{"format": 1, "issue_id": "i"}') is None
