"""The engine raises the kernel's neighbour-table limits while it runs (a flash crowd's
containers pass the default 1024 entries) and the last engine to stop puts the
machine's values back: on a folder standing in for /proc/sys/net/ipv4/neigh/default."""

from __future__ import annotations

from pathlib import Path

from pressrun.emulate.engine import (
    NEIGHBOUR_LIMITS,
    raise_neighbour_limits,
    restore_neighbour_limits,
)


def _sysctl(tmp_path: Path, values: dict[str, int]) -> Path:
    folder = tmp_path / "neigh"
    folder.mkdir()
    for name, value in values.items():
        (folder / name).write_text(f"{value}\n")
    return folder


def _read(folder: Path) -> dict[str, int]:
    return {name: int((folder / name).read_text()) for name in NEIGHBOUR_LIMITS}


def test_raised_while_running_and_the_machine_values_back_after(tmp_path: Path) -> None:
    machine = {"gc_thresh1": 128, "gc_thresh2": 512, "gc_thresh3": 1024}
    sysctl = _sysctl(tmp_path, machine)
    saved = tmp_path / "run" / "neighbour-limits.json"
    raise_neighbour_limits(sysctl, saved)
    assert _read(sysctl) == NEIGHBOUR_LIMITS
    # a second engine starting meanwhile does not save the raised values as the machine's
    raise_neighbour_limits(sysctl, saved)
    engine = tmp_path / "engine"
    # another engine still runs: the limits stay raised for it
    restore_neighbour_limits(engine, sysctl, saved, others=lambda _: True)
    assert _read(sysctl) == NEIGHBOUR_LIMITS
    # the last one stops: the machine's values are back
    restore_neighbour_limits(engine, sysctl, saved, others=lambda _: False)
    assert _read(sysctl) == machine
    assert not saved.exists()
    restore_neighbour_limits(engine, sysctl, saved, others=lambda _: False)  # none saved
    assert _read(sysctl) == machine


def test_higher_limits_are_never_lowered(tmp_path: Path) -> None:
    high = {"gc_thresh1": 100000, "gc_thresh2": 200000, "gc_thresh3": 400000}
    sysctl = _sysctl(tmp_path, high)
    raise_neighbour_limits(sysctl, tmp_path / "saved.json")
    assert _read(sysctl) == high
