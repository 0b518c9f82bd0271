"""The service worker's app shell (sw.js SHELL) names every module of the app.

A module missing from it is not cached at install, so the app fails to start offline
(its import fails) until it has been fetched once online; a split of app.js or any
other module must add the new file to the list.
"""

from __future__ import annotations

import re

from pressrun.reader.config import PACKAGE_DIR

WEB = PACKAGE_DIR / "web"


def shell_list() -> list[str]:
    """The paths of sw.js's SHELL array, as written."""
    text = (WEB / "sw.js").read_text()
    match = re.search(r"const SHELL = \[(.*?)\];", text, re.S)
    assert match is not None, "sw.js has no `const SHELL = [...]` list"
    return re.findall(r'"([^"]+)"', match.group(1))


def test_the_shell_names_every_module_of_the_app() -> None:
    modules = {f"js/{p.name}" for p in (WEB / "js").glob("*.js")}
    missing = sorted(modules - set(shell_list()))
    assert not missing, f"sw.js SHELL does not cache {missing}: add them to the list"


def test_every_module_the_shell_names_exists() -> None:
    gone = [p for p in shell_list() if p.startswith("js/") and not (WEB / p).is_file()]
    assert not gone, f"sw.js SHELL names files that are not in web/: {gone}"
