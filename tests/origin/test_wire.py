"""What the origin puts on the wire per answer: the headers travel with the body.

asyncio sets TCP_NODELAY, so without a cork the headers (one ``send``) leave in a
segment of their own before sendfile(2)'s body: two segments, two wake-ups of the
client, for every byte range a web seed asks for. With TCP_CORK around the headers and
the body (nginx's ``tcp_nopush``) a small answer is one segment.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

import pytest

from pressrun.origin import OriginConfig
from pressrun.origin.aio import start_origin

ISSUE = "issue-1"
#: offset of ``tcpi_segs_in`` (u32) in Linux's struct tcp_info (since 4.2)
_SEGS_IN_OFFSET = 140


def _segs_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < _SEGS_IN_OFFSET + 4:
        pytest.skip("the kernel's tcp_info has no tcpi_segs_in")
    value: int = struct.unpack_from("I", info, _SEGS_IN_OFFSET)[0]
    return value


def _one_answer(sock: socket.socket, first: int, last: int) -> bytes:
    """A keep-alive GET of bytes first..last; the whole answer (headers and body)."""
    sock.sendall(
        f"GET /content/{ISSUE}/part.bin HTTP/1.1\r\nHost: x\r\n"
        f"Range: bytes={first}-{last}\r\n\r\n".encode()
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 206"), head
    while len(body) < last - first + 1:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return body


async def test_headers_and_a_small_body_leave_in_one_segment(tmp_path: Path) -> None:
    (tmp_path / ISSUE).mkdir()
    payload = os.urandom(200_000)
    (tmp_path / ISSUE / "part.bin").write_bytes(payload)
    origin = await start_origin(OriginConfig(content_dir=tmp_path, port=0))
    try:

        def client() -> tuple[int, int]:
            with socket.create_connection(("127.0.0.1", origin.port)) as sock:
                assert _one_answer(sock, 0, 999) == payload[:1000]  # warm: handshake done
                before = _segs_in(sock)
                requests = 20
                for i in range(requests):
                    first = 1000 * i
                    assert _one_answer(sock, first, first + 1999) == payload[first : first + 2000]
                return requests, _segs_in(sock) - before

        requests, segments = await asyncio.to_thread(client)
    finally:
        await origin.stop()
    # one segment per answer (the odd pure ACK of a slow loop aside); was two each
    assert segments < 1.5 * requests, (segments, requests)
