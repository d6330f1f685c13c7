"""Many functions at once: the ``[tool.symgrad]`` table of a ``pyproject.toml``.

::

    [tool.symgrad]
    out = "generated"                  # default output folder, relative to this file
    # templates = "my_templates"       # default --templates, relative to this file

    [[tool.symgrad.functions]]
    name = "Blend"
    expr = "alpha*x*y + log(1 + y**2)*exp(-x)"
    params = ["alpha"]
    domain = { x = [0.1, 10] }         # like --domain x=0.1:10
    grad = { x = "1" }                 # like --grad x=1 (a surrogate gradient)
    vjp = { x = "clamp(grad_output, -1, 1)" }  # like --vjp (a whole surrogate input gradient)
    # also: inputs = ["x", "y"], inplace = true, save = "speed", fuse = true, fast = true, out = "...", templates = "..."

``symgrad build`` turns each entry into the same :class:`~symgrad.spec.Spec` that the
equivalent ``symgrad EXPR --name NAME ...`` command records, so every file it writes is an
ordinary generated module: ``symgrad regen`` and ``symgrad check`` work on it unchanged.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api import build_spec, output_path, record_templates
from ..errors import SymgradError
from ..spec import Spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the tomli backport for `symgrad build`
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

TABLE_KEYS = ("out", "templates", "fast", "functions")
FUNCTION_KEYS = ("name", "expr", "inputs", "params", "domain", "grad", "vjp", "inplace", "save", "fuse", "fast", "out", "templates")


@dataclass(frozen=True)
class Target:
    """One declared function: its spec and the file it is generated into."""

    spec: Spec
    out: Path
    path: Path


def load_targets(config: str | Path) -> list[Target]:
    """Read ``[tool.symgrad]`` from ``config`` into targets, in declaration order.

    Paths in the file are relative to the file's folder. The whole table is validated
    before anything is generated, so a mistake anywhere writes nothing.

    Raises:
        SymgradError: one line naming the file and the offending entry.
    """
    path = Path(config)
    table = _read_table(path)
    base = path.parent
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise SymgradError(f"{path}: [tool.symgrad] has unknown key {unknown[0]!r}; expected {_one_of(TABLE_KEYS)}")
    functions = table.get("functions", [])
    if not isinstance(functions, list) or not all(isinstance(entry, dict) for entry in functions):
        raise SymgradError(f"{path}: declare functions as [[tool.symgrad.functions]] tables")
    if not functions:
        raise SymgradError(f"{path}: [tool.symgrad] declares no [[tool.symgrad.functions]]")
    defaults = {key: _string(table, key, f"{path}: [tool.symgrad]") for key in ("out", "templates")}
    # (`fast = true` in [tool.symgrad] is every function's default)
    defaults["fast"] = _bool(table, "fast", f"{path}: [tool.symgrad]")
    targets = [_target(entry, index, path, base, defaults) for index, entry in enumerate(functions, 1)]
    _check_unique(targets, path)
    return targets


def _read_table(path: Path) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover
        raise SymgradError("symgrad build needs Python 3.11+ or the tomli package")
    try:
        with path.open("rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise SymgradError(f"{path}: no such file") from None
    except OSError as exc:
        raise SymgradError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SymgradError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # (TOML is UTF-8; a UTF-16 file was an internal error)
        raise SymgradError(f"{path}: invalid TOML: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    tool = document.get("tool", {})
    table = tool.get("symgrad") if isinstance(tool, dict) else None  # (`tool = 1` was an internal error)
    if not isinstance(table, dict):
        raise SymgradError(f"{path}: no [tool.symgrad] table")
    return table


def _target(entry: dict[str, Any], index: int, path: Path, base: Path, defaults: dict[str, Any]) -> Target:
    where = f"{path}: [[tool.symgrad.functions]] #{index}"
    if isinstance(entry.get("name"), str):
        where += f" ({entry['name']})"
    unknown = sorted(set(entry) - set(FUNCTION_KEYS))
    if unknown:
        raise SymgradError(f"{where}: unknown key {unknown[0]!r}; expected {_one_of(FUNCTION_KEYS)}")
    for key in ("name", "expr"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise SymgradError(f"{where}: {key!r} is required and must be a string")
    out = base / (_string(entry, "out", where) or defaults["out"] or "generated")
    templates = _string(entry, "templates", where) or defaults["templates"]
    # (read before the try: their errors already say where)
    options = dict(
        inputs=_names(entry, "inputs", where),
        params=_names(entry, "params", where),
        domain=_domain(entry, where),
        grads=_grads(entry, where),
        vjps=_grads(entry, where, "vjp"),
        inplace=_bool(entry, "inplace", where),
        save=_string(entry, "save", where) or "memory",
        fuse=_bool(entry, "fuse", where),
        fast=_bool(entry, "fast", where) if "fast" in entry else defaults["fast"],
    )
    try:
        spec = build_spec(
            entry["expr"],
            entry["name"],
            **options,
            templates=None if templates is None else record_templates(base / templates, out),
        )
        return Target(spec=spec, out=out, path=output_path(spec, out))
    except SymgradError as exc:
        raise SymgradError(f"{where}: {exc}") from None


def _check_unique(targets: list[Target], path: Path) -> None:
    """Two entries writing one file would overwrite each other on every build."""
    seen: dict[Path, str] = {}
    for target in targets:
        key = Path(str(target.path.resolve()).casefold())  # SiLU and SiLu both give si_lu.py
        if key in seen:
            raise SymgradError(
                f"{path}: functions {seen[key]!r} and {target.spec.name!r} would both write {target.path}"
            )
        seen[key] = target.spec.name


def _string(entry: dict[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise SymgradError(f"{where}: {key!r} must be a non-empty string")
    return value


def _bool(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise SymgradError(f"{where}: {key!r} must be true or false")
    return value


def _names(entry: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(n, str) and n.isidentifier() for n in value):
        raise SymgradError(f'{where}: {key!r} must be a list of names, e.g. ["x", "y"]')
    if len(set(value)) != len(value):
        raise SymgradError(f"{where}: {key!r} lists a name twice")
    return tuple(value)


def _domain(entry: dict[str, Any], where: str) -> dict[str, tuple[float, float]]:
    value = entry.get("domain", {})
    if not isinstance(value, dict):
        raise SymgradError(f"{where}: 'domain' must be a table, e.g. {{ x = [0.1, 10] }}")
    domain = {}
    for name, bounds in value.items():
        numbers = bounds if isinstance(bounds, list) and len(bounds) == 2 else None
        if numbers is None or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
            raise SymgradError(f"{where}: domain.{name} must be [LOW, HIGH], e.g. [0.1, 10]")
        low, high = float(numbers[0]), float(numbers[1])
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise SymgradError(f"{where}: domain.{name} needs finite LOW < HIGH")
        domain[name] = (low, high)
    return domain


def _grads(entry: dict[str, Any], where: str, key: str = "grad") -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(g, str) and g.strip() for g in value.values()):
        raise SymgradError(f"{where}: {key!r} must be a table of expressions, e.g. {{ x = \"1\" }}")
    return {name: expr.strip() for name, expr in value.items()}


def _one_of(keys: tuple[str, ...]) -> str:
    return "one of " + ", ".join(keys)


__all__ = ["Target", "load_targets"]
