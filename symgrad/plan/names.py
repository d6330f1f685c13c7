"""Every name a generated module uses for its own values, decided once per plan.

User symbols first avoid the names the generated code uses for itself, then symgrad's
own names (results, gradients, tangents, CSE temporaries) avoid the users'
(:mod:`symgrad.naming` hands them out).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..derive import Derivation
from ..naming import RESERVED, Namer
from ..codegen.printer import COMPILED_CALLS, HELPERS


@dataclass(frozen=True)
class Names:
    """The names of one plan's values."""

    symbols: dict[sympy.Symbol, str]  # inputs, params, results, temporaries
    public: dict[sympy.Symbol, str]
    results: tuple[sympy.Symbol, ...]
    grad_outputs: tuple[str, ...]
    grads: tuple[str, ...]
    tangents: tuple[str, ...]
    temporaries: "object"
    namer: Namer


def assign_names(derivation: Derivation, alias: str) -> Names:
    parsed = derivation.parsed
    spec = parsed.spec
    n_out = len(parsed.outputs)
    module_level = {spec.name, f"_{spec.name}NoJvp", derivative_class(spec.name), alias, "torch", value_name(alias)}
    if spec.fuse:
        module_level |= set(fused_names(alias).values()) | set(COMPILED_CALLS.values())
    # Builtins the generated bodies call, which a user symbol must not shadow.
    builtins_used = {"isinstance", "getattr"}
    # Names the bodies may use: printer.HELPERS too, which the public signature below need
    # not avoid, as the alias calls none (a user's `_erfcx` keeps its keyword there).
    in_bodies = module_level | set(HELPERS) | builtins_used
    # User symbols first avoid every name the generated code uses for itself ...
    user_namer = Namer(RESERVED | in_bodies)
    internal = {s: user_namer.claim(s.name) for s in parsed.inputs + parsed.params}
    # ... then symgrad's own names avoid the users' (a user may call a symbol ``t0``).
    namer = Namer(set(internal.values()) | in_bodies)
    # The public signature keeps the user's names; only ``torch`` (which the alias body
    # calls) and the module-level names must differ.
    public_namer = Namer(module_level)
    public = {s: public_namer.claim(s.name) for s in parsed.inputs + parsed.params}
    n_user = n_out - len(derivation.derivatives)
    results = tuple(sympy.Dummy(f"result{i}") for i in range(n_out))
    result_names = ["result"] if n_user == 1 else [f"result{i}" for i in range(n_user)]
    grad_names = ["grad_output"] if n_user == 1 else [f"grad_output{i}" for i in range(n_user)]
    # --save speed: d(result)/d(x) is returned as an output named dresult_dx.
    for (i, j), *_ in derivation.derivatives:
        result_names.append(f"d{result_names[i]}_d{internal[parsed.inputs[j]]}")
        grad_names.append(f"grad_{result_names[-1]}")
    symbols = dict(internal)
    symbols.update({r: namer.claim(n) for r, n in zip(results, result_names)})
    grad_outputs = tuple(namer.claim(n) for n in grad_names)
    grads = tuple(namer.claim(f"grad_{internal[s]}") for s in parsed.inputs)
    tangents = tuple(namer.claim(f"{internal[s]}_tangent") for s in parsed.inputs + parsed.params)
    return Names(symbols, public, results, grad_outputs, grads, tangents, namer.numbered("t"), namer)


def derivative_class(name: str) -> str:
    """The module-level Function computing d(result)/d(input) for double backward (SecondDerivative)."""
    return f"_{name}Derivative"


def value_name(alias: str) -> str:
    """The module-level function that computes a --save speed module's outputs alone."""
    return f"_{alias}_value"


def fused_names(alias: str) -> dict[str, str]:
    """Module-level names used only by fused modules."""
    return {
        "runner": "_fused",
        "cache": "_COMPILED",
        "eager_work": "_EAGER_WORK_LIMIT",
        "forward": f"_{alias}_forward",
        "backward": f"_{alias}_backward",
        "jvp": f"_{alias}_jvp",
    }


class SymbolStream:
    """CSE temporaries named t0, t1, ... that never collide with any other name."""

    def __init__(self, names: Names) -> None:
        self._names = names

    def __iter__(self):
        return self

    def __next__(self) -> sympy.Symbol:
        name = next(self._names.temporaries)
        symbol = sympy.Symbol(f"_cse_{name}", real=True)
        self._names.symbols[symbol] = name
        return symbol
