"""What a generated Function is compared with: the same formula through eager autograd,
and torch's own function for it where torch has one.

Both are independent of symgrad's rewriting: the eager formula is the expression exactly
as the user wrote it (parsed, printed term by term, differentiated by autograd), and
torch's own functions come from a fixed table keyed by the math, not by a class name.
``benchmarks/bench.py`` reads the same table, so the report and the benchmark compare
against the same kernels.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import sympy

from ..codegen.printer import TorchPrinter
from ..codegen.syntax import source
from ..frontend.parse import parse_outputs
from ..math.numbers import numbers_to_floats

# torch's own function for a one-input formula: (formula in ``x``, torch code in ``x``).
# A formula matches when it parses to the same SymPy expression, so "log(exp(x)+1)" finds
# softplus too. F.softplus switches to x above its threshold (20), where log(1+exp(x)) is x
# within float32's rounding: it is torch's function as users call it.
TORCH_OWN: tuple[tuple[str, str], ...] = (
    ("exp(x)", "torch.exp(x)"),
    ("exp(x) - 1", "torch.expm1(x)"),
    ("log(1 + x)", "torch.log1p(x)"),
    ("tanh(x)", "torch.tanh(x)"),
    ("1/(1 + exp(-x))", "torch.sigmoid(x)"),
    ("log(1 + exp(x))", "F.softplus(x)"),
    ("x/(1 + exp(-x))", "F.silu(x)"),
    ("x*tanh(log(1 + exp(x)))", "F.mish(x)"),
    ("x/2*(1 + erf(x/sqrt(2)))", "F.gelu(x)"),
    ("log((1 + erf(x/sqrt(2)))/2)", "torch.special.log_ndtr(x)"),
    ("log(1/(1 + exp(-x)))", "F.logsigmoid(x)"),
    ("sqrt(x)", "torch.sqrt(x)"),
    ("1/sqrt(x)", "torch.rsqrt(x)"),
    ("erfc(x)", "torch.special.erfc(x)"),
)


def _one_output(text: str) -> sympy.Expr | None:
    outputs = parse_outputs(text)
    if len(outputs) != 1 or outputs[0].reduction:
        return None
    return outputs[0].expr


def torch_own_code(expr_text: str, inputs: Sequence[str]) -> str | None:
    """torch code (in ``inputs[0]``) of torch's own function for a one-input formula, or None."""
    if len(inputs) != 1:
        return None
    expr = _one_output(expr_text)
    if expr is None or {s.name for s in expr.free_symbols} != {inputs[0]}:
        return None
    (symbol,) = expr.free_symbols
    for formula, code in TORCH_OWN:
        known = _one_output(formula)
        (x,) = known.free_symbols
        if known.xreplace({x: symbol}) == expr:
            # (the table's code is in x; a module's input may be named otherwise)
            return code if symbol.name == "x" else f"(lambda x: {code})({symbol.name})"
    return None


def eager_code(expr: sympy.Expr, names: Sequence[str]) -> str:
    """torch code of ``expr`` as written: every function a torch call, nothing rewritten."""
    symbols = {s: s.name for s in expr.free_symbols}
    anchor = next((name for name in names if name in symbols.values()), None)
    return source(TorchPrinter(symbols, reference=anchor).doprint(numbers_to_floats(expr)))


def as_function(code: str, names: Sequence[str], label: str) -> Callable:
    """A Python function of ``names`` evaluating torch ``code`` (our own printed text)."""
    import torch
    import torch.nn.functional as F

    from ..runtime import helpers

    namespace = {"torch": torch, "F": F, "math": math, **vars(helpers)}
    source = f"lambda {', '.join(names)}: {code}"
    return eval(compile(source, f"<{label}>", "eval"), namespace)  # noqa: S307 (printed by symgrad)
