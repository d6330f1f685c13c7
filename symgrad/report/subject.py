"""The function a report is about: a generated module, loaded, with the implementations
it is compared with (:mod:`.references`)."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sympy

from ..api import source_for_spec
from ..codegen.write import read_spec, read_text
from ..errors import SymgradError
from ..frontend.parse import Output, parse_outputs
from ..naming import snake_case
from ..plan.docs import metadata_of
from ..spec import Spec
from .references import as_function, eager_code, torch_own_code

# The implementations, in the order the table and the pictures show them.
GENERATED, EAGER, TORCH = "symgrad", "eager autograd", "torch's own"


@dataclass(frozen=True)
class Subject:
    """A loaded generated module and what it is compared with.

    Attributes:
        name: the Function's class name.
        expr: the formula as recorded in the module.
        outputs: the formula's outputs, parsed (the mpmath truth is computed from these).
        inputs: the differentiable inputs' names, in call order.
        params: the non-differentiable params with the values the module records.
        implementations: label -> callable of (*inputs, *params); GENERATED first.
        source: where the module came from (a path or the expression), for the page.
        domain: each input's sampling interval, as the module records it.
        inplace: whether the module overwrites its first input.
        surrogate: the inputs whose gradient is a surrogate, not the derivative.
    """

    name: str
    expr: str
    outputs: tuple[Output, ...]
    inputs: tuple[str, ...]
    params: dict[str, float]
    implementations: dict[str, Callable]
    source: str
    domain: dict[str, tuple[float, float]]
    inplace: bool = False
    surrogate: tuple[str, ...] = ()

    @property
    def symbols(self) -> list[sympy.Symbol]:
        """The SymPy symbols of the inputs, then the params, as the parsed outputs hold them."""
        by_name = {s.name: s for out in self.outputs for s in out.expr.free_symbols}
        return [by_name.get(name, sympy.Symbol(name, real=True)) for name in (*self.inputs, *self.params)]


def load_module_file(path: Path) -> Subject:
    """The subject for a generated module ``path``; SymgradError if it is not one."""
    if not path.is_file():
        raise SymgradError(f"{path} is not a file")
    text = read_text(path)
    spec = None if text is None else read_spec(text)
    if spec is None:
        raise SymgradError(f"{path} is not a symgrad module (it has no symgrad-spec header)")
    return _subject(_import(path, f"_symgrad_report_{path.stem}"), str(path))


def load_expression(spec: Spec) -> Subject:
    """The subject for an expression not yet written: generated into a temporary folder."""
    source = source_for_spec(spec)  # SymgradError on bad input, before anything is written
    folder = Path(tempfile.mkdtemp(prefix="symgrad_report_"))
    path = folder / f"{snake_case(spec.name)}.py"
    path.write_text(source, encoding="utf-8")
    return _subject(_import(path, f"_symgrad_report_{path.stem}"), spec.expr)


def _import(path: Path, name: str):
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    # In sys.modules before it runs: torch.compile looks the module's globals up by name.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise SymgradError(f"{path} does not import: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, "__symgrad__"):
        raise SymgradError(f"{path} is not a symgrad module (it has no __symgrad__ metadata)")
    return module


def _subject(module, source: str) -> Subject:
    meta = metadata_of(module)
    if meta.get("rowwise"):
        # (their metadata has no sampling domain, and the references here are elementwise)
        raise SymgradError(
            f"{source}: symgrad report does not cover row-wise or --vjp modules yet"
            " (tests/test_rowwise.py holds them to the contract)"
        )
    outputs = parse_outputs(meta["expr"])
    inputs = tuple(meta["inputs"])
    params = {name: float(value) for name, value in meta["params"].items()}
    names = [*inputs, *params]
    implementations = {GENERATED: getattr(module, meta["alias"])}
    eager = [eager_code(out.expr, names) for out in outputs]
    reduced = [f"torch.{out.reduction}({code})" if out.reduction else code for out, code in zip(outputs, eager)]
    implementations[EAGER] = as_function(
        reduced[0] if len(reduced) == 1 else "(" + ", ".join(reduced) + ",)", names, f"eager {meta['function']}"
    )
    own = None if params or meta.get("surrogate") else torch_own_code(meta["expr"], inputs)
    if own is not None:
        implementations[TORCH] = as_function(own, names, f"torch's own {meta['function']}")
    domain = {name: (float(low), float(high)) for name, (low, high) in meta["domain"].items()}
    return Subject(
        meta["function"], meta["expr"], outputs, inputs, params, implementations, source, domain,
        inplace=bool(meta["inplace"]), surrogate=tuple(sorted(meta["surrogate"])),
    )
