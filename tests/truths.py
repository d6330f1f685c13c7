"""Stored mpmath truths: the exact values and gradients the stability tests compare against.

Evaluating a case's formula until two precisions agree to 25 digits takes up to 1000 digits
where the plain formula cancels (the cloglog case alone took 17.5 s), so the truths are
computed once, by ``python tests/regen_truths.py``, and kept in tests/data/truths.json.

The store is keyed by case name and point and records each case's expression, so a lookup
never guesses: a point or case that is not stored, or a case whose expression changed, is a
loud error naming the command that regenerates the store (see tests/README.md).
test_truths.py checks that the store covers exactly the cases' points and recomputes a
seeded sample of it against mpmath.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import mpmath

STORE_PATH = Path(__file__).resolve().parent / "data" / "truths.json"
REGENERATE = "python tests/regen_truths.py"
# Significant digits kept: the truths agree to 25 digits between precisions, and the
# tightest tolerance that reads them is 1e-13.
DIGITS = 32
FORMAT = 1


class StaleTruths(LookupError):
    """The store lacks what a test asks for: it was not regenerated after a case changed."""


def point_key(point: Sequence[float]) -> str:
    """The store's key of a point: its coordinates' ``repr`` (exact for floats), comma-joined.

    -0.0 is keyed as 0.0 (``+ 0.0``): mpmath has no signed zero, so the truths are the same,
    and rounding -1e-30 to float16 gives -0.0."""
    return ",".join(repr(float(p) + 0.0) for p in point)


def parse_point(key: str) -> tuple[float, ...]:
    return tuple(float(p) for p in key.split(","))


def to_text(value: mpmath.mpf) -> str:
    return mpmath.nstr(value, DIGITS, min_fixed=1, max_fixed=0)


def from_text(text: str) -> mpmath.mpf:
    # (Parsed above the working precision, so the stored digits survive as they are.)
    with mpmath.workdps(DIGITS + 8):
        return mpmath.mpf(text)


class TruthStore:
    """The cases' stored truths: ``{name: {"expr": text, "points": {key: [dps, value, *grads]}}}``.

    ``dps`` is the precision at which the evaluation converged, kept so that the recompute
    check can pick a case's cheapest point."""

    def __init__(self, cases: dict[str, dict]):
        self.cases = cases

    @classmethod
    def load(cls, path: Path = STORE_PATH) -> "TruthStore":
        if not path.exists():
            return cls({})
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise StaleTruths(f"{path}: format {data.get('format')!r}, expected {FORMAT}: run `{REGENERATE}`")
        return cls(data["cases"])

    def lookup(self, name: str, expr: str, point: Sequence[float]) -> tuple[mpmath.mpf, list[mpmath.mpf]]:
        """(value, gradients) of case ``name`` at ``point``; StaleTruths if not stored as asked."""
        entry = self.cases.get(name)
        if entry is None:
            raise StaleTruths(f"no stored truths for case {name!r}: run `{REGENERATE}`")
        if entry["expr"] != expr:
            raise StaleTruths(
                f"case {name!r} is stored for {entry['expr']!r}, but is now {expr!r}: run `{REGENERATE}`"
            )
        row = entry["points"].get(point_key(point))
        if row is None:
            raise StaleTruths(f"case {name!r} has no stored truth at {tuple(point)}: run `{REGENERATE}`")
        _, value, *grads = row
        return from_text(value), [from_text(g) for g in grads]

    def rows(self) -> Iterable[tuple[str, tuple[float, ...], int, list[str]]]:
        """Every stored (case name, point, converged dps, [value, *grads] as text), in order."""
        for name in sorted(self.cases):
            for key, (dps, *numbers) in sorted(self.cases[name]["points"].items(), key=lambda item: parse_point(item[0])):
                yield name, parse_point(key), dps, numbers

    @staticmethod
    def write(cases: dict[str, dict], path: Path = STORE_PATH) -> None:
        """Write deterministically: sorted keys, one line per point, so that a diff reads."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["{", f'  "format": {FORMAT},', '  "cases": {']
        names = sorted(cases)
        for i, name in enumerate(names):
            entry = cases[name]
            lines.append(f"    {json.dumps(name)}: {{")
            lines.append(f'      "expr": {json.dumps(entry["expr"])},')
            lines.append('      "points": {')
            keys = sorted(entry["points"], key=lambda k: parse_point(k))
            for j, key in enumerate(keys):
                comma = "," if j < len(keys) - 1 else ""
                lines.append(f"        {json.dumps(key)}: {json.dumps(entry['points'][key])}{comma}")
            lines.append("      }")
            lines.append("    }" + ("," if i < len(names) - 1 else ""))
        lines += ["  }", "}", ""]
        path.write_text("\n".join(lines))
