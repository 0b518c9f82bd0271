"""The image carries every dependency a container imports: each module the services
and the clients run (and every uploader policy a client may pick) imports in a Python
where the dependencies the image leaves out (`HOST_ONLY`) cannot be imported. A
module that starts importing one of them fails here, not in a hundred containers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pressrun.emulate.held import PRELOAD
from pressrun.emulate.images import (
    HOST_ONLY,
    ImageBuildError,
    missing_reader_packages,
    project_tree,
)

#: what the containers run: docker-compose.yml's services (origin, balancer, trackers,
#: sender, supernodes, Redis aside), the clients (`pressrun get` through `held`) and
#: the browser readers (`browser_reader`, with Playwright's driver)
CONTAINER_MODULES = (
    "pressrun.cli",
    "pressrun.emulate.entrypoint",
    "pressrun.emulate.held",
    "pressrun.emulate.browser_reader",
    "playwright.async_api",
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


# --- the reader's npm packages in the image (a tree without them: a git archive) ---

READER = Path(__file__).resolve().parents[2] / "src" / "pressrun" / "reader"


def _tree_without_node_modules(root: Path) -> Path:
    """A project root whose src/pressrun holds a reader as ``git archive`` gives it:
    its package.json, package-lock.json and .npmrc, no node_modules."""
    reader = root / "src" / "pressrun" / "reader"
    reader.mkdir(parents=True)
    (root / "src" / "pressrun" / "__init__.py").write_text("")
    for name in ("package.json", "package-lock.json", ".npmrc"):
        shutil.copy(READER / name, reader / name)
    return root


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_a_tree_without_the_readers_packages_gets_them_from_its_lockfile(
    tmp_path: Path,
) -> None:
    # offline: from npm's cache, as make setup filled it (an image build runs offline)
    root = _tree_without_node_modules(tmp_path / "archive")
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("npm_config_offline", "true")
        project_tree(tmp_path / "context", root, said.append)
    copied = tmp_path / "context" / "project" / "pressrun" / "reader"
    assert missing_reader_packages(copied) == []
    assert any("npm ci" in line for line in said)
    # the checkout (here the archive) is left as it was: installed in the context only
    assert not (root / "src" / "pressrun" / "reader" / "node_modules").exists()


def test_without_npm_the_build_refuses_with_the_fix(tmp_path: Path) -> None:
    root = _tree_without_node_modules(tmp_path / "archive")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", str(tmp_path / "empty"))
        with pytest.raises(ImageBuildError, match=r"npm packages are not in the tree.*make setup"):
            project_tree(tmp_path / "context", root, lambda _line: None)


def test_missing_reader_packages_names_what_serve_reader_needs(tmp_path: Path) -> None:
    root = _tree_without_node_modules(tmp_path)
    missing = missing_reader_packages(root / "src" / "pressrun" / "reader")
    assert "libsodium-wrappers/dist/modules-esm/libsodium-wrappers.mjs" in missing
    if (READER / "node_modules").is_dir():  # a set-up checkout: nothing to install
        assert missing_reader_packages(READER) == []


def test_python_2_scripts_in_the_readers_npm_packages_do_not_stop_the_build(
    tmp_path: Path,
) -> None:
    # webtorrent's optional utp-native ships libutp's Python 2 parse_log.py: byte-
    # compiling the whole tree for the image failed on it ("byte-compiling the pressrun
    # tree for the image failed"); npm packages are not Python and are left alone
    root = _tree_without_node_modules(tmp_path / "tree")
    modules = root / "src" / "pressrun" / "reader" / "node_modules"
    for rel in missing_reader_packages(root / "src" / "pressrun" / "reader"):
        (modules / rel).parent.mkdir(parents=True, exist_ok=True)
        (modules / rel).write_text("export {};\n")
    script = modules / "utp-native" / "deps" / "libutp" / "parse_log.py"
    script.parent.mkdir(parents=True)
    script.write_text('print "scanning for socket with the most packets"\n')
    (root / "src" / "pressrun" / "mod.py").write_text("X = 1\n")
    project_tree(tmp_path / "context", root, lambda _line: None)
    built = tmp_path / "context" / "project" / "pressrun"
    assert list((built / "__pycache__").glob("mod.cpython-*.pyc"))  # the tree compiled


def test_the_image_carries_playwright_pinned_as_the_dev_extra() -> None:
    from pressrun.emulate.images import _dependencies

    deps = _dependencies(Path(__file__).resolve().parents[2])
    pins = [d for d in deps if d.startswith("playwright==")]
    assert len(pins) == 1 and not any(d.startswith("matplotlib") for d in deps)
