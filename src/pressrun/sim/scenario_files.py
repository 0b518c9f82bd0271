"""Scenario files: a built-in name or a TOML path -> its text, with errors that say what
to fix. `pressrun sim swarm` (`swarm_scenario`) and `pressrun emulate`
(`pressrun.emulate.scenario`) read theirs this way and validate the rest themselves."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def builtin_names(package: str, folder: str) -> list[str]:
    """The built-in scenarios: ``folder/*.toml`` inside ``package``."""
    root = resources.files(package) / folder
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def read_scenario_text(
    name_or_path: str, *, package: str, folder: str, kind: str, error: type[ValueError]
) -> tuple[str, str]:
    """(text, source) of a TOML file (a path ending in .toml, or one that exists) or of
    the built-in ``kind`` scenario of that name; ``error`` says what is wrong."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except OSError as err:
            raise error(f"cannot read scenario file {path}: {err.strerror or err}") from None
    res = resources.files(package) / folder / f"{name_or_path}.toml"
    if not res.is_file():
        raise error(
            f"no built-in {kind} scenario {name_or_path!r} and no such file; "
            f"built-in: {', '.join(builtin_names(package, folder))}"
        )
    return res.read_text(encoding="utf-8"), f"built-in {name_or_path}"
