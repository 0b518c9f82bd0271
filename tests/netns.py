"""Network namespaces for the root tests, and when they are skipped.

The tests that build links in namespaces (tests/multicast/test_netns.py,
test_layering_netns.py, test_amt_netns.py, tests/emulate/test_bridge_querier.py) skip
for the same reasons, said the same way:

- ``need_root_and(*tools, install=...)``: not root ("needs root to create network
  namespaces"), or a command missing from the PATH ("needs nft (<install>)");
- ``add_namespace(name)``: ``ip netns add`` refused (an unprivileged container), with
  ip's own error;

and ``delete_namespace(name)`` removes one at the end, whatever is left in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def need_root_and(*tools: str, install: str) -> None:
    """Skip the test unless it runs as root with each of ``tools`` on the PATH
    (``install``: how to get them, said in the skip)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} ({install})")


def add_namespace(name: str) -> None:
    """``ip netns add NAME``; where the host refuses, the test is skipped with ip's
    own error."""
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=20)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")


def delete_namespace(name: str) -> None:
    """``ip netns del NAME``, its devices with it; a failure is ignored (an end of a
    test, the namespace may not have been made)."""
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
