"""Type stubs of pressrun's binding over the Rust crate ``flute`` (see src/lib.rs)."""

from pathlib import Path

FLUTE_CRATE_VERSION: str

class EncodedObject:
    """One pass of an object: FDT packets, then object packets with their SBN/ESI."""

    @property
    def toi(self) -> int: ...
    @property
    def tsi(self) -> int: ...
    @property
    def fec(self) -> str: ...
    @property
    def transfer_length(self) -> int: ...
    @property
    def encoding_symbol_length(self) -> int: ...
    @property
    def content_md5(self) -> str | None: ...
    @property
    def fdt_instance_id(self) -> int: ...
    @property
    def block_source_symbols(self) -> list[int]: ...
    @property
    def source_symbols(self) -> int: ...
    @property
    def fdt_packets(self) -> list[bytes]: ...
    @property
    def packets(self) -> list[bytes]: ...
    @property
    def sbns(self) -> list[int]: ...
    @property
    def esis(self) -> list[int]: ...

def encode_object(
    content: bytes,
    *,
    content_location: str,
    content_type: str,
    tsi: int,
    toi: int,
    fec: str,
    encoding_symbol_length: int = 1400,
    max_source_block_length: int = 1024,
    repair_symbols_per_block: int = 0,
    fdt_duration_s: int = 86400,
    compute_md5: bool = True,
    fdt_instance_id: int = 1,
    sender_current_time: bool = True,
) -> EncodedObject: ...

def encode_fdt(
    *,
    content_location: str,
    content_type: str,
    transfer_length: int,
    content_md5: str | None,
    tsi: int,
    toi: int,
    fec: str,
    encoding_symbol_length: int = 1400,
    max_source_block_length: int = 1024,
    repair_symbols_per_block: int = 0,
    fdt_instance_id: int = 1,
    fdt_duration_s: int = 86400,
) -> list[bytes]: ...

def add_channel_sequence(packet: bytes, sequence: int) -> bytes: ...
def channel_sequence(packet: bytes) -> int | None: ...
def drain_datagrams(fds: list[int], duration_s: float, batch_wait_s: float = 0.02) -> int: ...

class ObjectEvent:
    """An object completed (``path`` set), failed or was interrupted."""

    @property
    def kind(self) -> str: ...
    @property
    def toi(self) -> int: ...
    @property
    def content_location(self) -> str: ...
    @property
    def path(self) -> Path | None: ...
    @property
    def content_length(self) -> int | None: ...

class Receiver:
    """One carousel's FLUTE receiver; use it from the thread that made it."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_cache_bytes: int = ...,
        object_timeout_s: float | None = None,
        md5_check: bool = False,
        clock_offset_s: float = 0.0,
    ) -> None: ...
    def push(self, packet: bytes) -> int | None: ...
    def push_channel(self, channel: int, packet: bytes) -> int | None: ...
    def take_sequence_counts(self) -> list[tuple[int, int, int]]: ...
    def forget_channel(self, channel: int) -> None: ...
    def receive(
        self,
        channels: list[tuple[int, int]],
        timeout_s: float,
        *,
        wake_fds: list[int] = ...,
        batch_wait_s: float = 0.02,
        drop_probability: float = 0.0,
        seed: int | None = None,
        tunnel_fd: int | None = None,
    ) -> tuple[list[tuple[int, int, int]], int, int, bool, bool]: ...
    def set_tunnel_channels(self, channels: list[tuple[str, int, int]]) -> None: ...
    def take_tunnel_messages(self) -> list[bytes]: ...
    @property
    def first_arrival(self) -> float | None: ...
    @property
    def end_arrival(self) -> float | None: ...
    def take_events(self) -> list[ObjectEvent]: ...
    def cleanup(self) -> None: ...
    @property
    def packets(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def decode_retries(self) -> int: ...

class PacketBuffer:
    """One carousel pass in Rust memory; ``send`` runs without the GIL."""

    def __init__(self, packets: list[bytes]) -> None: ...
    def __len__(self) -> int: ...
    def packet(self, index: int) -> bytes: ...
    def replace(self, index: int, packet: bytes) -> None: ...
    def send(
        self,
        fd: int,
        indices: list[int] | tuple[int, ...],
        host: str,
        port: int,
        sequence_start: int | None = None,
    ) -> tuple[int, int, int, str | None]: ...
