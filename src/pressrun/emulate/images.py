"""pressrun's images, built offline: no image registry is reachable, none is needed.

1. **The base image** ``pressrun-base:bookworm-KEY``: a Debian bookworm root file system
   made on the host with ``mmdebstrap --variant=minbase`` (Python 3.11, iproute2,
   nftables, redis-server; no manual pages, documentation but the copyright files, or
   translations), written straight into a tarball and imported with ``docker
   import``. The tarball is kept in the cache folder, so it is made once per machine
   (87 s in a measured cold build, with the downloads; docs/emulation.md). 130 MB
   where debootstrap's was 185 MB.
2. **The dependencies**: every dependency pinned in pyproject.toml but matplotlib
   (`HOST_ONLY`: only the host draws the report) as wheels (``pip
   wheel`` on the host, from pip's cache), unpacked on the host into a site-packages
   folder (``pip install --target --no-index``); kept per pyproject.toml hash. Made in
   parallel with the root file system.
3. **The dependencies' image** ``pressrun-deps:KEY``: the base image with 2 and the
   ``pressrun`` command copied in (`DEPS_DOCKERFILE`), built once per base and
   dependency set.
4. **The image** ``pressrun:latest`` (``PRESSRUN_IMAGE`` overrides the name): the root
   ``Dockerfile`` over 3 copies in the ``src/pressrun`` tree, byte-compiled on the
   host, the FLUTE extension the host built (``pressrun_flute``, from ``make
   setup``) and the web reader's npm packages (``src/pressrun/reader/node_modules``:
   copied when the tree has them, else installed into the build context from the
   reader's ``package-lock.json`` by ``npm ci`` on the host, from npm's cache first;
   the build stops with the fix when it cannot). No pip and no RUN step in any image
   (each RUN is a container started and committed: seconds on a loaded host; the
   image has no Node.js either), and the context of a rebuild after a change to the
   tree is the tree alone (78 MB, 75 of them the reader's npm packages; not the
   139 MB of dependencies).

`build_images` does all of it; ``pressrun emulate --build-only`` (``make images``) runs
it. Progress goes to the ``report`` callable, one line per step.
"""

from __future__ import annotations

import compileall
import fcntl
import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pressrun.emulate.engine import DockerCommandError, Engine

SUITE = "bookworm"
#: Debian packages the base image adds to minbase (tc and ip, nft, redis-server, ps,
#: Prometheus: the compose deployment's monitoring runs from the same image, coturn:
#: its STUN/TURN server for the readers' WebRTC peers, and Chromium with a font: the
#: emulation's browser readers, `pressrun.emulate.browser_reader`, issue 26)
BASE_PACKAGES = (
    "python3", "iproute2", "nftables", "redis-server", "procps", "prometheus", "coturn",
    "chromium", "fonts-liberation",
)  # fmt: skip
#: what dpkg leaves out of the base image (no container reads them; the copyright
#: files stay)
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
#: mmdebstrap's hook that merges /usr as bookworm does without the usrmerge package
#: (which would pull perl into the image)
MERGED_USR_HOOK = Path("/usr/share/mmdebstrap/hooks/merged-usr")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_IMAGE = "pressrun:latest"
#: wheels the image's Python needs beyond the host's: Debian's Python is 3.11.2 and
#: redis-py wants async-timeout below 3.11.3 (the host's 3.11.7 does not)
IMAGE_EXTRA_REQUIREMENTS = ("async-timeout==5.0.1",)
#: dependencies no container imports (the report's plots, drawn on the host): left out
#: of the image with what only they pull in. (numpy is in: the peer's stripes policy
#: uses it; tests/emulate/test_images.py imports every module a container runs with
#: these blocked)
HOST_ONLY = frozenset({"matplotlib"})
#: development pins the containers need too: Playwright drives the browser readers'
#: Chromium (`pressrun.emulate.browser_reader`, issue 26); its pin is pyproject.toml's
FROM_DEV = frozenset({"playwright"})


class ImageBuildError(RuntimeError):
    """An image could not be built; the message says which step and why."""


@dataclass(frozen=True, slots=True)
class BuiltImages:
    """What `build_images` produced."""

    base: str
    image: str
    seconds_by_step: dict[str, float]


def base_key() -> str:
    """A short hash of what goes into the base image (the tool, the suite, the package
    list, what dpkg leaves out)."""
    text = "\n".join(("mmdebstrap", "merged-usr", SUITE, *BASE_PACKAGES, *DPKG_OPTIONS))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _run(args: list[str], step: str, *, cwd: Path | None = None, timeout_s: float = 900) -> None:
    try:
        done = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        raise ImageBuildError(
            f"{step}: {args[0]} is not installed (`make setup` as root)"
        ) from None
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{step}: {args[0]} did not finish in {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise ImageBuildError(f"{step} failed (exit {done.returncode}): {tail}")


def root_filesystem(cache_dir: Path, mirror: str, report: Callable[[str], None]) -> Path:
    """The base root file system as a tarball in the cache, made with mmdebstrap once."""
    tarball = cache_dir / "base" / f"{SUITE}-{base_key()}.tar"
    if tarball.exists():
        return tarball
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError(
            "mmdebstrap is not installed: `make setup` (or apt-get install mmdebstrap) as root"
        )
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial")
    report(f"making the Debian {SUITE} root file system with mmdebstrap (once per machine)")
    try:
        _run(
            [
                "mmdebstrap",
                "--quiet",
                "--mode=root",
                "--variant=minbase",
                "--format=tar",
                f"--include={','.join(BASE_PACKAGES)}",
                f"--hook-dir={MERGED_USR_HOOK}",
                *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
                SUITE,
                str(partial),
                mirror,
            ],
            "mmdebstrap",
        )
        partial.rename(tarball)
    finally:
        partial.unlink(missing_ok=True)
    return tarball


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].lower()


def _dependencies(project_root: Path) -> list[str]:
    """pyproject.toml's pinned dependencies the containers import (not `HOST_ONLY`),
    and the development pins they need (`FROM_DEV`)."""
    doc = tomllib.loads((project_root / "pyproject.toml").read_text())
    deps: list[str] = doc["project"]["dependencies"]
    dev: list[str] = doc["project"].get("optional-dependencies", {}).get("dev", [])
    return [d for d in deps if _name(d) not in HOST_ONLY] + [d for d in dev if _name(d) in FROM_DEV]


def dependency_site(cache_dir: Path, project_root: Path, report: Callable[[str], None]) -> Path:
    """Every pinned dependency unpacked into a site-packages folder, kept per hash of
    the dependency list (wheels from pip's cache on the host)."""
    deps = [*_dependencies(project_root), *IMAGE_EXTRA_REQUIREMENTS]
    key = hashlib.sha256("\n".join(deps).encode()).hexdigest()[:12]
    site = cache_dir / "site" / f"deps-{key}"
    if (site / ".complete").exists():
        return site
    wheels = cache_dir / "wheels" / f"deps-{key}"
    if not (wheels / ".complete").exists():
        shutil.rmtree(wheels, ignore_errors=True)
        wheels.mkdir(parents=True)
        report(f"collecting the wheels of {len(deps)} pinned dependencies (pip wheel)")
        _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), *deps],
            "pip wheel (dependencies)",
        )
        (wheels / ".complete").touch()
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    report("unpacking the dependencies for the image (pip install --target)")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            *sorted(str(w) for w in wheels.glob("*.whl")),
        ],
        "pip install --target (dependencies)",
    )
    # console scripts carry the host's interpreter path; the image runs modules
    shutil.rmtree(site / "bin", ignore_errors=True)
    (site / ".complete").touch()
    return site


#: how the reader's npm packages are installed into the build context when the tree
#: lacks them (as `make setup` does; ``--prefer-offline``: from npm's cache on the host
#: without asking the registry for what the cache holds, so a set-up machine builds
#: offline; ``--ignore-scripts``: no package the reader uses needs one, see its .npmrc)
NPM_CI = (
    "npm", "ci", "--omit=optional", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund",
    "--prefer-offline",
)  # fmt: skip


def reader_dev_packages(reader_dir: Path) -> set[Path]:
    """The folders under ``reader_dir/node_modules`` of packages only the reader's tests
    use (``"dev": true`` in its package-lock.json); none if the lockfile is unreadable."""
    try:
        packages = json.loads((reader_dir / "package-lock.json").read_text())["packages"]
    except (OSError, ValueError, KeyError):
        return set()
    return {reader_dir / name for name, meta in packages.items() if name and meta.get("dev")}


def missing_reader_packages(reader_dir: Path) -> list[str]:
    """The files under ``reader_dir/node_modules`` that ``pressrun serve reader`` serves
    and that are absent (its own start-up check, `pressrun.reader.aio.check_assets`:
    with any of them missing the reader exits, and a container restarts it forever)."""
    from pressrun.reader.aio import VENDOR_FILES

    modules = reader_dir / "node_modules"
    return [rel for rel in VENDOR_FILES.values() if not (modules / rel).is_file()]


def reader_packages(reader_dir: Path, report: Callable[[str], None]) -> None:
    """Make sure the copy of the reader at ``reader_dir`` (in the build context, never
    the checkout) has its npm packages: a tree without them (a ``git archive``, a clone
    before ``make setup``) gets them from its ``package-lock.json`` with `NPM_CI`;
    raise `ImageBuildError` with the fix when npm is missing or fails. (Installed on the
    host, not by a RUN step: the image has no Node.js, and builds run with no network.)"""
    missing = missing_reader_packages(reader_dir)
    if not missing:
        return
    fix = "run `make setup` (or `npm ci --omit=optional` in src/pressrun/reader) and build again"
    if not (reader_dir / "package-lock.json").is_file():
        raise ImageBuildError(
            f"the reader's npm packages are not in the tree ({missing[0]} is missing) and "
            f"there is no package-lock.json to install them from: {fix}"
        )
    if shutil.which(NPM_CI[0]) is None:
        raise ImageBuildError(
            f"the reader's npm packages are not in the tree ({missing[0]} is missing) and "
            f"npm is not installed to install them: {fix}"
        )
    report("installing the reader's npm packages from its package-lock.json (npm ci)")
    shutil.rmtree(reader_dir / "node_modules", ignore_errors=True)
    try:
        _run(list(NPM_CI), "npm ci (the reader's packages)", cwd=reader_dir, timeout_s=600)
    except ImageBuildError as err:
        raise ImageBuildError(f"{err}; {fix}") from None
    still = missing_reader_packages(reader_dir)
    if still:
        raise ImageBuildError(
            f"npm ci left the reader's packages incomplete ({still[0]} is missing): {fix}"
        )


def project_tree(context: Path, project_root: Path, report: Callable[[str], None] = print) -> None:
    """pressrun's source tree, the FLUTE extension the host built and the reader's npm
    packages (`reader_packages`) into ``context``, byte-compiled here
    (``unchecked-hash``: the image's files never change, and its Python 3.11 reads the
    host's 3.11 bytecode), so the image needs no RUN step."""
    target = context / "project"
    # the reader's test tools (devDependencies: axe-core, lighthouse and theirs, 175 MB)
    # are never served: left out of the image
    dev = reader_dev_packages(project_root / "src" / "pressrun" / "reader")
    python_cache = shutil.ignore_patterns("__pycache__", "*.pyc")

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(python_cache(folder, names)) | {n for n in names if Path(folder, n) in dev}

    shutil.copytree(project_root / "src" / "pressrun", target / "pressrun", ignore=ignore)
    reader_packages(target / "pressrun" / "reader", report)
    spec = importlib.util.find_spec("pressrun_flute")
    if spec is not None and spec.submodule_search_locations:
        # the PyO3 binding make setup built (cp311, the image's Python too)
        folder = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(folder, target / folder.name,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    if not compileall.compile_dir(
        target / "pressrun",
        quiet=1,
        # the reader's npm packages are not Python (some carry Python 2 build scripts:
        # utp-native's parse_log.py stopped a build)
        rx=re.compile(r"[/\\]node_modules[/\\]"),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    ):
        raise ImageBuildError("byte-compiling the pressrun tree for the image failed")


#: the dependencies' image over the base: the environment, every dependency and the
#: `pressrun` command (the project's image, the root Dockerfile, adds only the tree)
DEPS_DOCKERFILE = """\
FROM {base}
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONPATH=/opt/pressrun/site LANG=C.UTF-8 PYTHONUNBUFFERED=1
COPY deps/ /opt/pressrun/site/
COPY bin/ /usr/local/bin/
WORKDIR /var/lib/pressrun
"""
#: the image's ``pressrun``: the console script's own entry point (pyproject.toml)
PRESSRUN_COMMAND = "#!/usr/bin/python3\nfrom pressrun.cli import console_main\nconsole_main()\n"


def _docker_build(engine: Engine, context: Path, image: str, *build_args: str) -> None:
    try:
        engine.run(
            ["docker", "build", "--network", "none",
             *(a for arg in build_args for a in ("--build-arg", arg)),
             "--tag", image, str(context)],
            timeout_s=900,
        )  # fmt: skip
    except DockerCommandError as err:
        raise ImageBuildError(f"docker build of {image} failed: {err}") from None


def deps_image(
    engine: Engine, cache_dir: Path, base: str, deps: Path, report: Callable[[str], None]
) -> str:
    """``pressrun-deps:KEY`` (the base image, the dependencies, the command), built
    once per base and dependency set."""
    tag = f"pressrun-deps:{hashlib.sha256(f'{base} {deps.name}'.encode()).hexdigest()[:12]}"
    if engine.run(["docker", "image", "inspect", tag], check=False).returncode == 0:
        return tag
    context = cache_dir / "context-deps"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    # hard links: the context is read by docker build, never written
    shutil.copytree(deps, context / "deps", copy_function=os.link,
                    ignore=shutil.ignore_patterns(".complete"))  # fmt: skip
    command = context / "bin" / "pressrun"
    command.parent.mkdir()
    command.write_text(PRESSRUN_COMMAND)
    command.chmod(0o755)
    (context / "Dockerfile").write_text(DEPS_DOCKERFILE.format(base=base))
    report(f"building {tag}: the dependencies over {base} (once per dependency set)")
    _docker_build(engine, context, tag)
    shutil.rmtree(context, ignore_errors=True)
    return tag


def build_images(
    engine: Engine,
    *,
    cache_dir: Path,
    project_root: Path,
    image: str = DEFAULT_IMAGE,
    mirror: str = DEFAULT_MIRROR,
    report: Callable[[str], None] = print,
) -> BuiltImages:
    """Build what is missing of the base image, the dependencies' image and
    pressrun's image; nothing is pulled. Two runs on one host (their cache folder
    shared) build one after the other: the second waits for the first's lock."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / "build.lock").open("a") as lock:
        # a concurrent build removed and refilled the shared context folder under this
        # one's copy (FileExistsError in project_tree, a suite run of two emulations)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_images(
            engine,
            cache_dir=cache_dir,
            project_root=project_root,
            image=image,
            mirror=mirror,
            report=report,
        )


def _build_images(
    engine: Engine,
    *,
    cache_dir: Path,
    project_root: Path,
    image: str,
    mirror: str,
    report: Callable[[str], None],
) -> BuiltImages:
    import time

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    base = f"pressrun-base:{SUITE}-{base_key()}"
    have_base = engine.run(["docker", "image", "inspect", base], check=False).returncode == 0
    # the root file system (mmdebstrap) and the dependencies (pip) both wait mostly on
    # downloads: made side by side
    with ThreadPoolExecutor(max_workers=2) as pool:
        rootfs = None if have_base else pool.submit(root_filesystem, cache_dir, mirror, report)
        deps_job = pool.submit(dependency_site, cache_dir, project_root, report)
        deps = deps_job.result()
        seconds["dependencies"] = time.perf_counter() - started
        tarball = None if rootfs is None else rootfs.result()
    if tarball is not None:
        seconds["root file system"] = time.perf_counter() - started
        report(f"importing {tarball.name} as {base}")
        mark = time.perf_counter()
        try:
            engine.run(["docker", "import", str(tarball), base])
        except DockerCommandError as err:
            raise ImageBuildError(f"docker import of the base image failed: {err}") from None
        seconds["import"] = time.perf_counter() - mark
    mark = time.perf_counter()
    with_deps = deps_image(engine, cache_dir, base, deps, report)
    seconds["dependencies' image"] = time.perf_counter() - mark
    context = cache_dir / "context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    project_tree(context, project_root, report)
    shutil.copy(project_root / "Dockerfile", context / "Dockerfile")
    report(f"building {image} from {with_deps} (docker build: the pressrun tree)")
    mark = time.perf_counter()
    _docker_build(engine, context, image, f"DEPS_IMAGE={with_deps}")
    seconds["docker build"] = time.perf_counter() - mark
    remove_stale_images(engine, keep={base, with_deps})
    return BuiltImages(base, image, seconds)


def remove_stale_images(engine: Engine, keep: set[str]) -> None:
    """Remove the base and dependencies' images of other keys (an older package or
    dependency list) and the untagged images earlier builds of pressrun's image left
    (each rebuild untags the one before); an image a container still uses stays."""
    listed = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False)
    stale = [
        name
        for name in listed.split()
        if name.split(":")[0] in ("pressrun-base", "pressrun-deps") and name not in keep
    ]
    if stale:
        engine.run(["docker", "rmi", *stale], check=False)
    engine.run(["docker", "image", "prune", "-f"], check=False)
