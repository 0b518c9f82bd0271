"""The docs say what the code does: flags, variables, examples and links cannot drift.

For every ``pressrun`` command (found by walking the argparse parser that
``pressrun.cli.build_parser`` builds, no subprocess), every flag appears in a table
row of the command's doc page (its component's page, by the module of its handler,
or the one ``COMMAND_DOCS`` names); every ``PRESSRUN_*`` variable the code reads (a
quoted name in ``src/pressrun``, or a ``${PRESSRUN_...}`` in ``docker-compose.yml``)
appears in a table row of the page of the component that reads it (``VARIABLE_DOCS``
where several do) and, for the compose file's, of docs/emulation.md; a flag in the
first column of a page's table exists (on a command or a bench script); every
``pressrun ... --flag`` example in README.md and docs/*.md names flags its command
has; and every relative link in README.md and docs/ points at a file that exists.

A failure names the command, the flag or variable and the page: add a row for it
to that page's flag table (or take the stale row out).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from pressrun.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Each command's reference page, where its flags are listed in a table: the page of the
# component whose module registers it (COMPONENT_DOCS, below, by the module of the
# command's handler), or the one named here.
COMMAND_DOCS: dict[str, str] = {
    "pressrun": "docs/operations.md",  # --log-level, --version: every command
    "sim chord": "docs/chord.md",
    "sim swarm": "docs/chord.md",
}

# A variable the Python code reads is documented on the page of the component that
# reads it (the package under src/pressrun/, or the top-level module); one read in
# several components is named here. A variable docker-compose.yml reads is also in
# the compose reference, docs/emulation.md.
COMPONENT_DOCS: dict[str, str] = {
    "balancer": "docs/balancer.md",
    "chord": "docs/chord.md",
    "clients": "docs/client.md",
    "content": "docs/publishing.md",
    "demo": "docs/demo.md",
    "emulate": "docs/emulation.md",
    "multicast": "docs/multicast.md",
    "origin": "docs/origin.md",
    "peer": "docs/swarm.md",
    "reader": "docs/reader.md",
    "security": "docs/security.md",
    "sim": "docs/simulator.md",
    "subscriptions": "docs/subscriptions.md",
    "tracker": "docs/tracker.md",
}
VARIABLE_DOCS: dict[str, str] = {
    "PRESSRUN_OPERATOR_TOKEN": "docs/security.md",
    "PRESSRUN_CA_FILE": "docs/security.md",
    "PRESSRUN_SUBSCRIPTIONS_TOKEN": "docs/subscriptions.md",
    "PRESSRUN_MULTICAST_TOKEN": "docs/multicast.md",
    "PRESSRUN_BALANCERS": "docs/client.md",
    "PRESSRUN_BALANCER": "docs/client.md",
    "PRESSRUN_STUN": "docs/swarm.md",
}
COMPOSE = "docker-compose.yml"
COMPOSE_DOC = "docs/emulation.md"

# A page's tables may also list the flags of the bench scripts (bench/*.py).
BENCH_FLAG = re.compile(r'add_argument\(\s*(?:"-\w",\s*)?"(--[a-z0-9-]+)"')

_VARIABLE = re.compile(r"PRESSRUN_[A-Z0-9_]*[A-Z0-9]")
_QUOTED_VARIABLE = re.compile(r"""(?<![\w])["'](""" + _VARIABLE.pattern + r""")["']""")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a `pressrun ...` command line in an example: the command words, then the rest
_EXAMPLE = re.compile(r"(?:^|[\s/(;&|])pressrun((?:\s+[a-z][a-z-]*)+)((?:\s+\S+)*)")


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command that takes flags: ("serve balancer", its parser), ...; a
    command with subcommands yields only its leaves (and the root, for the global
    flags)."""
    children = [
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ]
    if not children or not path:
        yield (" ".join(path) or "pressrun", parser)
    for action in children:
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) in seen:  # an alias
                continue
            seen.add(id(child))
            yield from _commands(child, (*path, name))


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags of one command (``--help`` left out)."""
    flags: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags.extend(f for f in action.option_strings if f.startswith("--"))
    return flags


@cache
def _all_commands() -> dict[str, list[str]]:
    return {name: _flags(parser) for name, parser in _commands(build_parser())}


def _table_rows(page: str) -> list[str]:
    return [
        line
        for line in (ROOT / page).read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith("|")
    ]


def _in_a_row(rows: list[str], word: str) -> bool:
    pattern = re.compile(r"`[^`]*(?<![\w-])" + re.escape(word) + r"(?![\w-])[^`]*`")
    return any(pattern.search(row) for row in rows)


def _variables_read() -> dict[str, set[str]]:
    """``PRESSRUN_*`` names the code reads, each with who reads it (components, and
    ``COMPOSE``): exact string constants in the source (``os.environ.get(
    "PRESSRUN_STUN")``, ``TOKEN_ENV = "..."``, the emulation's compose environment) and
    the compose file's ``${PRESSRUN_...}``."""
    readers: dict[str, set[str]] = {}
    package = ROOT / "src" / "pressrun"
    for source in package.rglob("*.py"):
        component = source.relative_to(package).parts[0].removesuffix(".py")
        # a quoted string that is exactly the name (a regex: parsing every module's
        # syntax tree took seconds on a loaded machine)
        for name in _QUOTED_VARIABLE.findall(source.read_text(encoding="utf-8")):
            readers.setdefault(name, set()).add(component)
    compose = (ROOT / COMPOSE).read_text(encoding="utf-8")
    for name in re.findall(r"\$\{(" + _VARIABLE.pattern + r")", compose):
        readers.setdefault(name, set()).add(COMPOSE)
    return readers


def _variable_pages(name: str, readers: set[str]) -> set[str]:
    """The pages that must list a variable: its component's (or the named one), and
    the compose reference when the compose file reads it."""
    pages: set[str] = set()
    components = readers - {COMPOSE, "emulate"}
    if name in VARIABLE_DOCS:
        pages.add(VARIABLE_DOCS[name])
    elif len(components) == 1:
        pages.add(COMPONENT_DOCS.get(next(iter(components)), COMPOSE_DOC))
    elif components:
        pages.add(f"VARIABLE_DOCS (read by {sorted(components)}: name its page)")
    if COMPOSE in readers or not pages:
        pages.add(COMPOSE_DOC)
    return pages


def _page_of(command: str, parser: argparse.ArgumentParser) -> str:
    """The doc page of a command: named in COMMAND_DOCS, else its component's."""
    if command in COMMAND_DOCS:
        return COMMAND_DOCS[command]
    module = str(getattr(parser._defaults.get("func"), "__module__", ""))
    parts = module.split(".")
    component = parts[1] if len(parts) > 2 and parts[0] == "pressrun" else ""
    return COMPONENT_DOCS.get(component, f"(no page: {module or 'no handler'})")


@cache
def _pages() -> dict[str, str]:
    return {name: _page_of(name, parser) for name, parser in _commands(build_parser())}


def test_every_command_has_a_page() -> None:
    pages = _pages()
    assert set(COMMAND_DOCS) - set(pages) == set(), "COMMAND_DOCS names commands that are gone"
    lost = {name: page for name, page in pages.items() if not (ROOT / page).is_file()}
    assert lost == {}, "commands without a doc page: name one in COMMAND_DOCS"


@pytest.mark.parametrize("command", sorted(_pages()))
def test_every_flag_is_documented(command: str) -> None:
    page = _pages()[command]
    rows = _table_rows(page)
    flags = _all_commands().get(command, [])
    missing = [flag for flag in flags if not _in_a_row(rows, flag)]
    assert missing == [], f"`pressrun {command}` flags without a table row in {page}: {missing}"


def _bench_flags() -> set[str]:
    return {
        flag
        for script in (ROOT / "bench").glob("*.py")
        for flag in BENCH_FLAG.findall(script.read_text(encoding="utf-8"))
    }


@pytest.mark.parametrize("page", sorted(set(_pages().values())))
def test_no_documented_flag_is_stale(page: str) -> None:
    """A flag in the first column of a page's table exists: on a pressrun command
    (a page may list another command's flags where it explains them) or a bench
    script."""
    known = {flag for flags in _all_commands().values() for flag in flags}
    known |= _bench_flags()
    known.add("--help")
    stale: list[str] = []
    for row in _table_rows(page):
        cells = row.strip().strip("|").split("|")
        first = cells[0] if cells else ""
        for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", first):
            if flag not in known:
                stale.append(flag)
    assert stale == [], f"{page} lists flags no command of the page has: {stale}"


def test_every_variable_is_documented() -> None:
    read = _variables_read()
    assert set(VARIABLE_DOCS) - set(read) == set(), "VARIABLE_DOCS names variables no code reads"
    missing: dict[str, list[str]] = {}
    for name, readers in sorted(read.items()):
        for page in sorted(_variable_pages(name, readers)):
            if not (ROOT / page).exists() or not _in_a_row(_table_rows(page), name):
                missing.setdefault(page, []).append(name)
    assert missing == {}, f"variables without a table row on their page: {missing}"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_relative_links_point_at_files() -> None:
    broken: list[str] = []
    for doc in _markdown_files():
        text = doc.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == [], f"links to files that do not exist: {broken}"


def _subcommands(
    parser: argparse.ArgumentParser,
) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def test_examples_use_flags_that_exist() -> None:
    """Every ``pressrun <command> ... --flag`` written in README.md and docs/*.md (code
    blocks and inline code; not docs/results/, which keeps what was run then) names
    flags the command has."""
    root = build_parser()
    root_flags = {flag for action in root._actions for flag in action.option_strings}
    wrong: list[str] = []
    checked = 0
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL)
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
        for chunk in blocks + inline:
            for line in chunk.replace("\\\n", " ").splitlines():
                for match in _EXAMPLE.finditer(line):
                    words = match.group(1).split()
                    parser, used = root, 0
                    while used < len(words):
                        children = _subcommands(parser)
                        if children is None or words[used] not in children:
                            break
                        parser = children[words[used]]
                        used += 1
                    if used == 0:
                        continue  # prose ("pressrun delivers ..."), not a command
                    rest = " ".join(words[used:]) + " " + match.group(2)
                    rest = re.split(r"\s[|;&#]|\)", rest)[0]  # up to a pipe, ;, & or comment
                    known = root_flags | {f for a in parser._actions for f in a.option_strings}
                    checked += 1
                    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                        if flag not in known:
                            command = " ".join(words[:used])
                            wrong.append(f"{doc.relative_to(ROOT)}: pressrun {command} {flag}")
    assert checked > 100, f"only {checked} examples found: is the pattern still right?"
    assert wrong == [], f"examples with flags their command does not have: {wrong}"
