"""The deployment's STUN/TURN server (deploy/coturn/turnserver.conf, docker-compose.yml's
``turn`` service) is a real one: Debian's coturn started with that file, on 127.0.0.1,
answers a STUN Binding with the client's address, grants a TURN allocation to the user
the compose file gives it (and only with the right password), and refuses to relay to
the private ranges the file denies. A plain STUN/TURN client of RFC 5389/5766 over UDP,
written here, speaks to it."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "deploy" / "coturn" / "turnserver.conf"
MAGIC = 0x2112A442
USER, PASSWORD, REALM = "reader", "a-test-password", "pressrun"

BINDING, ALLOCATE, CREATE_PERMISSION = 0x0001, 0x0003, 0x0008
SUCCESS, ERROR = 0x0100, 0x0110
ATTR_USERNAME, ATTR_MESSAGE_INTEGRITY, ATTR_ERROR_CODE = 0x0006, 0x0008, 0x0009
ATTR_XOR_PEER_ADDRESS, ATTR_REALM, ATTR_NONCE = 0x0012, 0x0014, 0x0015
ATTR_XOR_RELAYED_ADDRESS, ATTR_REQUESTED_TRANSPORT = 0x0016, 0x0019
ATTR_XOR_MAPPED_ADDRESS, ATTR_SOFTWARE = 0x0020, 0x8022

needs_coturn = pytest.mark.skipif(
    shutil.which("turnserver") is None,
    reason="coturn is not installed (scripts/setup-system.sh installs it)",
)


@dataclass
class Reply:
    """A decoded STUN message: its type and attributes (type -> raw value)."""

    kind: int
    attrs: dict[int, bytes]

    def error_code(self) -> int:
        value = self.attrs[ATTR_ERROR_CODE]
        return value[2] * 100 + value[3]

    def xor_address(self, attr: int) -> tuple[str, int]:
        value = self.attrs[attr]
        port = struct.unpack("!H", value[2:4])[0] ^ (MAGIC >> 16)
        host = struct.unpack("!I", value[4:8])[0] ^ MAGIC
        return str(ipaddress.IPv4Address(host)), port


def _attr(kind: int, value: bytes) -> bytes:
    pad = b"\0" * (-len(value) % 4)
    return struct.pack("!HH", kind, len(value)) + value + pad


def _xor_peer(host: str, port: int) -> bytes:
    address = int(ipaddress.IPv4Address(host)) ^ MAGIC
    return struct.pack("!BBHI", 0, 1, port ^ (MAGIC >> 16), address)


def _message(kind: int, attrs: list[bytes], *, key: bytes | None = None) -> bytes:
    """A request; with ``key``, MESSAGE-INTEGRITY (HMAC-SHA1 over the message with the
    length counting the integrity attribute, RFC 5389 section 15.4)."""
    tid = secrets.token_bytes(12)
    body = b"".join(attrs)
    if key is None:
        return struct.pack("!HHI", kind, len(body), MAGIC) + tid + body
    header = struct.pack("!HHI", kind, len(body) + 24, MAGIC) + tid
    mac = hmac.new(key, header + body, hashlib.sha1).digest()
    return header + body + _attr(ATTR_MESSAGE_INTEGRITY, mac)


def _decode(data: bytes) -> Reply:
    kind, length, magic = struct.unpack("!HHI", data[:8])
    assert magic == MAGIC
    attrs: dict[int, bytes] = {}
    at = 20
    while at < 20 + length:
        a_kind, a_len = struct.unpack("!HH", data[at : at + 4])
        attrs[a_kind] = data[at + 4 : at + 4 + a_len]
        at += 4 + a_len + (-a_len % 4)
    return Reply(kind, attrs)


class TurnClient:
    """One UDP socket speaking STUN/TURN to the server at ``address``."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)

    def ask(self, message: bytes) -> Reply:
        """Send ``message`` until an answer comes (UDP: resent every 0.5 s, up to 10 s)."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self.sock.sendto(message, self.address)
            try:
                data, _ = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            if data[8:20] == message[8:20]:  # this request's transaction
                return _decode(data)
        raise AssertionError(f"no answer from {self.address} in 10 s")

    def close(self) -> None:
        self.sock.close()


def _free_udp_ports(count: int) -> list[int]:
    """``count`` consecutive UDP ports free on 127.0.0.1 now (coturn's relay range)."""
    for _ in range(50):
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
        probe.close()
        if first + count > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return list(range(first, first + count))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no range of free UDP ports")


def _start_coturn(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """coturn on free ports, answering a STUN Binding: a port taken between the probe
    and coturn's bind (the suite runs on three workers) makes it exit, and a start on a
    loaded machine takes seconds, so it is started again on other ports until it
    answers (in a parallel run of the suite one gave no answer in 10 s)."""
    log = tmp_path / "turn.log"
    for _ in range(3):
        listen, *relay = _free_udp_ports(6)
        proc = _spawn_coturn(tmp_path, listen, relay, log)
        probe = TurnClient(("127.0.0.1", listen))
        deadline = time.monotonic() + 30.0
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                probe.sock.sendto(_message(BINDING, []), probe.address)
                try:
                    probe.sock.recvfrom(4096)
                    return proc, listen
                except (TimeoutError, ConnectionRefusedError):
                    continue
        finally:
            probe.close()
        proc.kill()
        proc.wait(timeout=5)
    raise AssertionError(f"coturn never answered; its log:\n{log.read_text()[-3000:]}")


def _spawn_coturn(
    tmp_path: Path, listen: int, relay: list[int], log: Path
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "turnserver",
            "-c",
            str(CONF),
            "--listening-ip=127.0.0.1",
            "--relay-ip=127.0.0.1",
            f"--listening-port={listen}",
            f"--min-port={relay[0]}",
            f"--max-port={relay[-1]}",
            f"--user={USER}:{PASSWORD}",
            f"--pidfile={tmp_path / 'turn.pid'}",
            f"--userdb={tmp_path / 'turndb'}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("PRESSRUN_")},
    )


@pytest.fixture
def turn(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """coturn with the deployment's file, on 127.0.0.1, as docker-compose.yml starts it
    (the user and the relay range on the command line), answering."""
    proc, listen = _start_coturn(tmp_path)
    try:
        yield "127.0.0.1", listen
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _authenticated(client: TurnClient, password: str) -> tuple[Reply, bytes, list[bytes]]:
    """An Allocate: first unauthenticated (401 with realm and nonce, as RFC 5766 has
    it), then with the long-term credential; the reply, the key and the auth attributes."""
    transport = _attr(ATTR_REQUESTED_TRANSPORT, bytes([17, 0, 0, 0]))  # UDP
    challenge = client.ask(_message(ALLOCATE, [transport]))
    assert challenge.kind == ALLOCATE | ERROR and challenge.error_code() == 401
    realm, nonce = challenge.attrs[ATTR_REALM], challenge.attrs[ATTR_NONCE]
    assert realm == REALM.encode()
    key = hashlib.md5(f"{USER}:{REALM}:{password}".encode()).digest()
    auth = [_attr(ATTR_USERNAME, USER.encode()), _attr(ATTR_REALM, realm), _attr(ATTR_NONCE, nonce)]
    return client.ask(_message(ALLOCATE, [transport, *auth], key=key)), key, auth


@needs_coturn
def test_coturn_with_the_deployment_file_answers_stun_and_grants_turn(
    turn: tuple[str, int],
) -> None:
    client = TurnClient(turn)
    try:
        # STUN: the client's own address, as a browser learns its public one
        binding = client.ask(_message(BINDING, []))
        assert binding.kind == BINDING | SUCCESS
        assert binding.xor_address(ATTR_XOR_MAPPED_ADDRESS) == client.sock.getsockname()
        assert ATTR_SOFTWARE not in binding.attrs  # no-software-attribute

        # TURN with the wrong password: refused
        wrong, _, _ = _authenticated(client, "not-the-password")
        assert wrong.kind == ALLOCATE | ERROR and wrong.error_code() == 401

    finally:
        client.close()
    # TURN with the compose file's user (a new transaction from another socket): a
    # relayed address in the relay range
    client = TurnClient(turn)
    try:
        granted, _, _ = _authenticated(client, PASSWORD)
    finally:
        client.close()
    assert granted.kind == ALLOCATE | SUCCESS, granted.attrs.get(ATTR_ERROR_CODE)
    host, port = granted.xor_address(ATTR_XOR_RELAYED_ADDRESS)
    assert host == "127.0.0.1"
    assert turn[1] < port <= turn[1] + 5


@needs_coturn
def test_coturn_relays_to_no_private_address(turn: tuple[str, int]) -> None:
    client = TurnClient(turn)
    try:
        granted, key, auth = _authenticated(client, PASSWORD)
        assert granted.kind == ALLOCATE | SUCCESS

        def permission(host: str) -> Reply:
            peer = _attr(ATTR_XOR_PEER_ADDRESS, _xor_peer(host, 6881))
            return client.ask(_message(CREATE_PERMISSION, [peer, *auth], key=key))

        # the deployment's own network and the host: 403 Forbidden
        for host in ("10.1.2.3", "172.17.0.2", "192.168.1.10", "169.254.169.254", "127.0.0.1"):
            refused = permission(host)
            assert refused.kind == CREATE_PERMISSION | ERROR, host
            assert refused.error_code() == 403, (host, refused.error_code())
        # a peer on the Internet (a documentation address) and one on the emulation's
        # network (198.18.0.0/15): allowed
        for host in ("203.0.113.7", "198.18.10.5"):
            allowed = permission(host)
            assert allowed.kind == CREATE_PERMISSION | SUCCESS, (host, allowed.attrs)
    finally:
        client.close()
