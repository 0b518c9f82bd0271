"""Services install their SIGTERM/SIGINT handlers before they say they listen
(`pressrun.service.stop_signals`): a supervisor that signals as soon as it reads the
start-up line gets a clean shutdown, not a process killed mid-start."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest


def _args(service: str, tmp_path: Path) -> tuple[list[str], str, str]:
    """(serve arguments, the start-up line's marker, the clean-shutdown log line)."""
    content = tmp_path / "content"
    content.mkdir(exist_ok=True)
    if service == "tracker":
        args = ["tracker", "--port", "0", "--db", str(tmp_path / "t.db"), "--allow-any"]
        return args, "tracker listening on", "tracker stopping: flushing the store"
    if service == "balancer":
        args = ["balancer", "--port", "0", "--origins", "a=http://127.0.0.1:9"]
        return args, "balancer listening on", "balancer stopping"
    if service == "reader":
        args = ["reader", "--port", "0", "--balancer", "http://127.0.0.1:9"]
        args += ["--publisher-key", "00" * 32]
        return args, "reader serving the web app", "reader: signal received, stopping"
    args = [
        "origin",
        "--port",
        "0",
        "--content",
        str(content),
        "--name",
        "o",
        "--capacity-mbps",
        "100",
    ]
    return args, "origin o serving", "signal received, stopping"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("service", ["tracker", "balancer", "origin", "reader"])
def test_a_signal_right_after_the_listening_line_stops_cleanly(
    service: str, sig: signal.Signals, tmp_path: Path
) -> None:
    args, marker, stopping = _args(service, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "--log-level", "INFO", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                proc.send_signal(sig)  # at once, as a supervisor would
                break
        else:
            pytest.fail(f"{service} ended before its start-up line: {''.join(seen)[-500:]}")
        rest = proc.stderr.read()
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen) + rest
    assert code == 0, log[-2000:]
    assert stopping in log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
