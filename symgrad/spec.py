"""The recorded spec: everything needed to rebuild one generated module.

A ``Spec`` is what the user asked for, before any math is done. It is written into the
header of every generated file (as JSON), so ``symgrad regen`` can rebuild the file
from the file alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from .errors import SymgradError

SAVE_POLICIES = ("memory", "speed")


@dataclass(frozen=True)
class Spec:
    """One function to generate: what the user asked for, before any math is done.

    Build one with :func:`symgrad.build_spec`, which validates the arguments. Its JSON form
    is the ``# symgrad-spec:`` line of a generated file's header:

    >>> spec = Spec(expr="x**2", name="Square")
    >>> spec.to_json()
    '{"expr": "x**2", "name": "Square"}'
    >>> Spec.from_json(spec.to_json()) == spec
    True

    Args:
        expr: the expression text, e.g. ``"sqrt(x)+1/x"``; a tuple gives several outputs.
        name: the class name, a CamelCase Python identifier.
        inputs: differentiable inputs in signature order; ``None`` means the free
            symbols sorted by name, minus ``params``.
        params: non-differentiable values (numbers or tensors) passed after the inputs.
        domain: ``(symbol, low, high)`` sampling intervals that override derived ones.
        grads: ``(input, expr)`` surrogate gradients replacing d(output)/d(input).
        vjps: ``(input, expr)`` whole input gradients, written with ``grad_output`` (the
            upstream gradient): a surrogate backward; the module's jvp raises, and double
            backward differentiates the surrogate as written.
        inplace: generate a variant that overwrites its (single) input.
        save: ``"memory"`` saves as few bytes as possible; ``"speed"`` may save more.
        fuse: run forward and backward bodies through ``torch.compile``.
        fast: eager bodies reuse their temporaries' buffers in place and add a sum's
            products with one kernel each (addcmul), instead of plain out-of-place code.
        templates: a directory of templates overriding the built-in ones.
    """

    expr: str
    name: str
    inputs: tuple[str, ...] | None = None
    params: tuple[str, ...] = ()
    domain: tuple[tuple[str, float, float], ...] = ()
    grads: tuple[tuple[str, str], ...] = ()
    vjps: tuple[tuple[str, str], ...] = ()
    inplace: bool = False
    save: str = "memory"
    fuse: bool = False
    fast: bool = False
    templates: str | None = None

    def to_json(self) -> str:
        """Serialise deterministically: sorted keys, ASCII only, defaults left out."""
        default = Spec(expr=self.expr, name=self.name)
        data = {
            key: value
            for key, value in asdict(self).items()
            if key in ("expr", "name") or value != getattr(default, key)
        }
        return json.dumps(data, sort_keys=True, separators=(", ", ": "), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> "Spec":
        """Inverse of :meth:`to_json`; raises ``SymgradError`` on a malformed record."""
        try:
            data: dict[str, Any] = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError("not an object")
            # A field this version does not know would be dropped by a rebuild: refuse instead.
            unknown = sorted(set(data) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"unknown field {unknown[0]!r} (written by a newer symgrad?)")
            for key in ("inputs", "params"):
                if data.get(key) is not None and not _is_list_of(data[key], str):
                    raise TypeError(f"{key!r} is not a list of names")
            if not isinstance(data.get("templates", ""), str):
                raise TypeError("'templates' is not a string")
            for flag in ("inplace", "fuse", "fast"):
                if not isinstance(data.get(flag, False), bool):
                    raise TypeError(f"{flag!r} is {data[flag]!r}, not true or false")
            if data.get("save", "memory") not in SAVE_POLICIES:
                raise ValueError(f"'save' is {data['save']!r}, not one of {', '.join(SAVE_POLICIES)}")
            return cls(
                expr=str(data["expr"]),
                name=str(data["name"]),
                inputs=None if data.get("inputs") is None else tuple(data["inputs"]),
                params=tuple(data.get("params", ())),
                domain=tuple((str(s), float(lo), float(hi)) for s, lo, hi in data.get("domain", ())),
                grads=tuple((str(s), str(g)) for s, g in data.get("grads", ())),
                vjps=tuple((str(s), str(g)) for s, g in data.get("vjps", ())),
                inplace=data.get("inplace", False),
                save=str(data.get("save", "memory")),
                fuse=data.get("fuse", False),
                fast=data.get("fast", False),
                templates=data.get("templates"),
            )
        except KeyError as exc:
            raise SymgradError(f"malformed symgrad-spec record: missing field {exc}") from None
        except (ValueError, TypeError) as exc:
            raise SymgradError(f"malformed symgrad-spec record: {exc}") from None


def _is_list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(item, kind) for item in value)


def parse_domain_option(text: str) -> tuple[str, float, float]:
    """Parse ``--domain x=0.1:10`` into ``("x", 0.1, 10.0)``."""
    symbol, sep, bounds = text.partition("=")
    low, colon, high = bounds.partition(":")
    try:
        if not (sep and colon and symbol.strip()):
            raise ValueError
        lo, hi = float(low), float(high)
    except ValueError:
        raise SymgradError(f"--domain {text!r}: expected NAME=LOW:HIGH, e.g. x=0.1:10") from None
    if not (lo < hi) or any(v != v or abs(v) == float("inf") for v in (lo, hi)):
        raise SymgradError(f"--domain {text!r}: need finite LOW < HIGH")
    return symbol.strip(), lo, hi


def parse_grad_option(text: str, option: str = "--grad") -> tuple[str, str]:
    """Parse ``--grad x=EXPR`` (or ``--vjp x=EXPR``) into ``("x", "EXPR")``."""
    symbol, sep, expr = text.partition("=")
    if not sep or not symbol.strip() or not expr.strip():
        example = "x=clamp(grad_output, -1, 1)" if option == "--vjp" else "x=1"
        raise SymgradError(f"{option} {text!r}: expected NAME=EXPR, e.g. {example}")
    return symbol.strip(), expr.strip()


def parse_name_list(text: str | None, option: str) -> tuple[str, ...] | None:
    """Parse ``--inputs a,b`` into ``("a", "b")``; ``None`` stays ``None``."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if not all(names) or not all(n.isidentifier() for n in names):
        raise SymgradError(f"{option} {text!r}: expected comma-separated names, e.g. x,y")
    if len(set(names)) != len(names):
        raise SymgradError(f"{option} {text!r}: a name is listed twice")
    return names


__all__ = ["SAVE_POLICIES", "Spec", "parse_domain_option", "parse_grad_option", "parse_name_list"]
