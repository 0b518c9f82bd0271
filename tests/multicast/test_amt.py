"""The AMT codec (RFC 7450 messages, the encapsulated IGMPv3 query and report): exact
bytes, round trips, bad input refused, and every message type decoded by Wireshark's
own AMT dissector (tshark) without an error."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pressrun.multicast import amt

GATEWAY = ("198.51.100.7", 40123)
SOURCE = "192.0.2.1"
GROUP = "232.10.0.1"


def _messages() -> list[amt.Message]:
    query = amt.igmpv3_general_query("192.0.2.254")
    report = amt.igmpv3_report(
        "0.0.0.0",
        [
            amt.GroupRecord(amt.ALLOW_NEW_SOURCES, GROUP, (SOURCE,)),
            amt.GroupRecord(amt.BLOCK_OLD_SOURCES, "232.10.0.2", (SOURCE,)),
        ],
    )
    data = amt.udp_datagram((SOURCE, 5000), (GROUP, 5400), b"FLUTE packet" * 10)
    mac = amt.response_mac(b"relay secret", GATEWAY, 0xDEADBEEF)
    return [
        amt.RelayDiscovery(0x01020304),
        amt.RelayAdvertisement(0x01020304, "203.0.113.9"),
        amt.Request(0xDEADBEEF),
        amt.MembershipQuery(mac, 0xDEADBEEF, query, gateway=GATEWAY),
        amt.MembershipQuery(mac, 0xDEADBEEF, query, loaded=True),
        amt.MembershipUpdate(mac, 0xDEADBEEF, report),
        amt.MulticastData(data),
        amt.Teardown(mac, 0xDEADBEEF, GATEWAY),
    ]


def test_every_message_round_trips() -> None:
    for message in _messages():
        assert amt.decode(amt.encode(message)) == message


def test_fixed_layouts_are_the_rfcs() -> None:
    """RFC 7450 section 5.1: version 0 and the type in the first byte; the Request's
    P flag in the low bit of the second; the Query's L and G flags; the MAC in bytes
    2..7 and the nonce in 8..11; the gateway as port then an IPv4-compatible address."""
    assert amt.encode(amt.RelayDiscovery(0x01020304)) == bytes.fromhex("0100000001020304")
    assert amt.encode(amt.RelayAdvertisement(7, "203.0.113.9")) == bytes.fromhex(
        "0200000000000007cb007109"
    )
    assert amt.encode(amt.Request(9, mld=True)) == bytes.fromhex("0301000000000009")
    teardown = amt.encode(amt.Teardown(0x0A0B0C0D0E0F, 9, ("10.0.0.2", 2268)))
    assert teardown == bytes.fromhex("07000a0b0c0d0e0f0000000908dc") + bytes(12) + bytes(
        [10, 0, 0, 2]
    )
    query = amt.encode(amt.MembershipQuery(1, 2, amt.igmpv3_general_query(SOURCE), loaded=True))
    assert query[:2] == b"\x04\x02"


def test_encapsulated_igmp_is_whole_and_checked() -> None:
    query = amt.read_general_query(amt.igmpv3_general_query(SOURCE, query_interval_s=125))
    assert query == amt.GeneralQuery(max_response_s=10.0, query_interval_s=125, robustness=2)
    # 300 s has no exact IGMP code (floating point above 127, RFC 3376 4.1.7): 288 is
    # the one below
    assert amt.read_general_query(amt.igmpv3_general_query(SOURCE, query_interval_s=300)) == (
        amt.GeneralQuery(10.0, 288, 2)
    )
    records = [amt.GroupRecord(amt.MODE_IS_INCLUDE, GROUP, (SOURCE, "192.0.2.2"))]
    packet = amt.igmpv3_report("10.0.0.2", records)
    ip = amt.read_ip_packet(packet)
    assert (ip.destination, ip.protocol, ip.ttl) == (amt.IGMPV3_ROUTERS, 2, 1)
    assert amt.read_report(packet) == records
    src, dst, payload = amt.read_udp_datagram(amt.udp_datagram((SOURCE, 1), (GROUP, 2), b"x"))
    assert (src, dst, payload) == ((SOURCE, 1), (GROUP, 2), b"x")


def test_bad_input_is_a_clear_error() -> None:
    good = amt.encode(_messages()[5])
    for data, match in [
        (b"", "empty"),
        (b"\x11" + bytes(7), "version 1"),
        (b"\x09" + bytes(7), "unknown AMT message type 9"),
        (b"\x01" + bytes(8), "8 bytes"),
        (b"\x03" + bytes(3), "8 bytes"),
        (good[:20], "IPv4"),
        (good[:22] + bytes([good[22] ^ 1]) + good[23:], "header checksum"),
        (b"\x07" + bytes(20), "30 bytes"),
        (b"\x06\x00abc", "without an IP datagram"),
    ]:
        with pytest.raises(amt.AmtError, match=match):
            amt.decode(data)
    with pytest.raises(amt.AmtError, match="48-bit"):
        amt.encode(amt.MembershipUpdate(1 << 48, 1, b""))
    with pytest.raises(amt.AmtError, match="not a multicast group"):
        amt.igmpv3_report("10.0.0.2", [amt.GroupRecord(amt.ALLOW_NEW_SOURCES, "10.1.1.1")])
    many = [amt.GroupRecord(amt.ALLOW_NEW_SOURCES, GROUP, (SOURCE,))] * 65
    with pytest.raises(amt.AmtError, match="65 group records"):
        amt.read_report(amt.igmpv3_report("10.0.0.2", many))
    update = amt.decode(good)
    assert isinstance(update, amt.MembershipUpdate)
    body = bytearray(update.report)
    body[-5] ^= 0xFF  # a source address changed: the IGMP checksum no longer holds
    with pytest.raises(amt.AmtError, match="IGMP checksum"):
        amt.read_report(bytes(body))


def test_response_mac_binds_address_port_and_nonce() -> None:
    mac = amt.response_mac(b"k", GATEWAY, 5)
    assert 0 <= mac < 1 << 48
    assert mac == amt.response_mac(b"k", GATEWAY, 5)
    others = {
        amt.response_mac(b"other", GATEWAY, 5),
        amt.response_mac(b"k", ("198.51.100.8", GATEWAY[1]), 5),
        amt.response_mac(b"k", (GATEWAY[0], GATEWAY[1] + 1), 5),
        amt.response_mac(b"k", GATEWAY, 6),
    }
    assert mac not in others and len(others) == 4


def _pcap(payloads: list[bytes], path: Path) -> None:
    """A pcap of Ethernet/IPv4/UDP frames from a gateway's port to 2268 and back."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for i, payload in enumerate(payloads):
        to_relay = amt.message_type(payload) in (1, 3, 5, 7)
        src, dst = (GATEWAY, ("203.0.113.9", amt.AMT_PORT))[:: 1 if to_relay else -1]
        datagram = amt.udp_datagram(src, dst, payload, ttl=64)
        frame = bytes(6) + bytes([2, 0, 0, 0, 0, 1]) + b"\x08\x00" + datagram
        out.append(struct.pack("<IIII", 1_700_000_000 + i, 0, len(frame), len(frame)) + frame)
    path.write_bytes(b"".join(out))


def test_tshark_decodes_every_message_type_without_error(tmp_path: Path) -> None:
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark is not installed (scripts/setup-system.sh installs it)")
    pcap = tmp_path / "amt.pcap"
    _pcap([amt.encode(m) for m in _messages()], pcap)
    fields = subprocess.run(
        [tshark, "-r", str(pcap), "-T", "fields", "-e", "amt.type", "-e", "_ws.expert"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split("\n")
    assert [line.split("\t")[0] for line in fields if line] == [
        "1", "2", "3", "4", "4", "5", "6", "7"
    ]  # fmt: skip
    # no expert info (malformed, bad length) on any frame
    assert all(line.split("\t")[1:] in ([""], []) for line in fields if line), fields
    verbose = subprocess.run(
        [tshark, "-r", str(pcap), "-V"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "Malformed" not in verbose
    # the encapsulated packets are dissected too: the IGMPv3 query and report, the UDP
    assert "Membership Query" in verbose and "Membership Report" in verbose
    assert f"Group Address: {GROUP}" in verbose or GROUP in verbose
    assert "Response MAC" in verbose and "L Flags" in verbose
