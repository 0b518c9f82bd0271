"""Checks of scenario tables: each field's type and range, with errors that say where
and what to fix (`ScenarioError`). Used by the scenario loader (`scenario.py`) and the
arrival patterns (`arrivals.py`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class ScenarioError(ValueError):
    """A scenario file is missing, malformed or inconsistent; the message says where."""


#: the request classes a scenario may give its assets (`RequestClass` values)
REQUEST_CLASSES = ("small", "crowd", "catalogue")


def _err(source: str, where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{source}: {where}: {msg}")


def _number(
    table: Mapping[str, Any],
    key: str,
    default: float | None,
    source: str,
    where: str,
    *,
    minimum: float | None = 0.0,
    positive: bool = False,
) -> float:
    if key not in table:
        if default is None:
            raise _err(source, where, f"missing required field {key!r}")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _err(source, f"{where}.{key}", f"must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise _err(source, f"{where}.{key}", "must be finite")
    if positive and value <= 0:
        raise _err(source, f"{where}.{key}", f"must be > 0, got {value:g}")
    if minimum is not None and value < minimum:
        raise _err(source, f"{where}.{key}", f"must be >= {minimum:g}, got {value:g}")
    return value


def _flag(table: Mapping[str, Any], key: str, default: bool, source: str, where: str) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _err(source, f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def _check_keys(table: Mapping[str, Any], allowed: set[str], source: str, where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _err(
            source,
            where,
            f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}",
        )


def _table(doc: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise _err(source, key, "must be a table")
    return value


def _array(doc: Mapping[str, Any], key: str, source: str) -> list[Mapping[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _err(source, key, f"must be an array of tables ([[{key}]])")
    return value


def _request_class(value: Any, source: str, where: str) -> str | None:
    """A request class name (``small``, ``crowd``, ``catalogue``) or None."""
    if value is None:
        return None
    if value not in REQUEST_CLASSES:
        raise _err(
            source,
            f"{where}.request_class",
            f"must be one of {', '.join(REQUEST_CLASSES)}, got {value!r}",
        )
    return str(value)
