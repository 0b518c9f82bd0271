"""The image carries every dependency a container imports: each module the services
and the clients run (and every uploader policy a client may pick) imports in a Python
where the dependencies the image leaves out (`HOST_ONLY`) cannot be imported. A
module that starts importing one of them fails here, not in a hundred containers."""

from __future__ import annotations

import subprocess
import sys

from pressrun.emulate.held import PRELOAD
from pressrun.emulate.images import HOST_ONLY

#: what the containers run: docker-compose.yml's services (origin, balancer, trackers,
#: sender, supernodes, Redis aside) and the clients (`pressrun get` through `held`)
CONTAINER_MODULES = (
    "pressrun.cli",
    "pressrun.emulate.entrypoint",
    "pressrun.emulate.held",
    *PRELOAD,
    "pressrun.origin.aio",
    "pressrun.balancer.aio",
    "pressrun.tracker.aio",
    "pressrun.multicast.sender",
    "pressrun.multicast.cli",
    "pressrun.chord.aio",
    "pressrun.chord.cli",
)

CHECK = """
import importlib, importlib.abc, sys
blocked = set(sys.argv[1].split(","))

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not in the image (HOST_ONLY)")
        return None

sys.meta_path.insert(0, Blocked())
for module in sys.argv[2:]:
    importlib.import_module(module)
from pressrun.peer.uploader import make_uploader_policy, uploader_policy_names
for name in uploader_policy_names():
    make_uploader_policy(name)
print("ok")
"""


def test_every_module_a_container_runs_imports_without_the_host_only_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, ",".join(sorted(HOST_ONLY)), *CONTAINER_MODULES],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
