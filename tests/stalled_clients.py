"""Clients that ask for a body and stop reading (issue 25, finding 1), for tests.

``await stall(port, target, n)`` opens ``n`` connections to 127.0.0.1:port, each sends
``GET target`` and never reads a byte (a small receive buffer, so the server's socket
buffers fill soon). Close the sockets when done.
"""

from __future__ import annotations

import asyncio
import socket


async def stall(port: int, target: str, n: int, rcvbuf: int = 4096) -> list[socket.socket]:
    """``n`` connections that send ``GET target`` and never read a byte."""
    loop = asyncio.get_running_loop()
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        await loop.sock_sendall(s, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(s)
    return socks
