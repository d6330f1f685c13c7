"""The single table of supported functions: what users write, what SymPy builds, what
torch code prints, and where the function is defined.

This table is the single source of truth for the parser's whitelist, the printer and
the sampling-domain derivation; the README's table is generated from it
(``python -m symgrad --list-functions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from ..math.functions import erfcx, hypot, log_ndtr, logaddexp, ndtr, sigmoid, softplus, xlogy
from ..math.rounding import round_half_even


# Where a function's argument must lie, for sampling test inputs. OpInfo-style domains.

POSITIVE = "positive"  # arg > 0
NONZERO = "nonzero"  # arg != 0
UNIT = "unit"  # -1 < arg < 1
ABOVE_ONE = "above_one"  # arg > 1


@dataclass(frozen=True)
class Entry:
    """One supported function.

    Args:
        name: what users write in an expression.
        build: makes the SymPy expression from the parsed arguments.
        arity: the allowed numbers of arguments (``None`` for "one or more").
        torch: the torch spelling, for the README table.
        domain: where the (first) argument must lie, or ``None``.
        note: a caveat for the README table.
    """

    name: str
    build: Callable[..., sympy.Expr]
    arity: tuple[int, ...] | None
    torch: str
    domain: str | None = None
    note: str = ""


def _log(arg: sympy.Expr, base: sympy.Expr | None = None) -> sympy.Expr:
    return sympy.log(arg) if base is None else sympy.log(arg) / sympy.log(base)


def _relu(arg: sympy.Expr) -> sympy.Expr:
    return sympy.Max(arg, 0)


def _clamp(arg: sympy.Expr, low: sympy.Expr, high: sympy.Expr) -> sympy.Expr:
    # torch.clamp applies the minimum first, then the maximum: where low > high, it is high.
    return sympy.Min(sympy.Max(arg, low), high)


def _where(condition: sympy.logic.boolalg.Boolean, value: sympy.Expr, otherwise: sympy.Expr) -> sympy.Expr:
    # (The parser parses the condition as a Piecewise condition and builds the same Piecewise.)
    return sympy.Piecewise((value, condition), (otherwise, True))


def _unary(name: str, fn: Callable[..., sympy.Expr], torch: str, domain: str | None = None, note: str = "") -> Entry:
    return Entry(name, fn, (1,), torch, domain, note)


FUNCTIONS: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        _unary("sqrt", sympy.sqrt, "torch.sqrt", POSITIVE),
        _unary("exp", sympy.exp, "torch.exp"),
        Entry("log", _log, (1, 2), "torch.log", POSITIVE, "log(x, b) is log(x)/log(b)"),
        _unary("log1p", log1p, "torch.log1p"),
        _unary("expm1", expm1, "torch.expm1"),
        _unary("sin", sympy.sin, "torch.sin"),
        _unary("cos", sympy.cos, "torch.cos"),
        _unary("tan", sympy.tan, "torch.tan"),
        _unary("asin", sympy.asin, "torch.asin", UNIT),
        _unary("acos", sympy.acos, "torch.acos", UNIT),
        _unary("atan", sympy.atan, "torch.atan"),
        Entry("atan2", sympy.atan2, (2,), "torch.atan2", note="atan2(y, x)"),
        _unary("sinh", sympy.sinh, "torch.sinh"),
        _unary("cosh", sympy.cosh, "torch.cosh"),
        _unary("tanh", sympy.tanh, "torch.tanh"),
        _unary("asinh", sympy.asinh, "torch.asinh"),
        _unary("acosh", sympy.acosh, "torch.acosh", ABOVE_ONE),
        _unary("atanh", sympy.atanh, "torch.atanh", UNIT),
        _unary("Abs", sympy.Abs, "torch.abs", note="also abs(x)"),
        _unary("abs", sympy.Abs, "torch.abs", note="same as Abs"),
        _unary("sign", sympy.sign, "torch.sign"),
        Entry("Max", sympy.Max, None, "torch.maximum / torch.clamp", note="any arity, elementwise"),
        Entry("Min", sympy.Min, None, "torch.minimum / torch.clamp", note="any arity, elementwise"),
        Entry("max", sympy.Max, None, "torch.maximum / torch.clamp", note="same as Max"),
        Entry("min", sympy.Min, None, "torch.minimum / torch.clamp", note="same as Min"),
        _unary("relu", _relu, "torch.clamp(x, min=0)", note="Max(x, 0)"),
        Entry("clamp", _clamp, (3,), "torch.clamp / torch.maximum / torch.minimum", note="clamp(x, lo, hi) is Min(Max(x, lo), hi)"),
        Entry("Piecewise", sympy.Piecewise, None, "torch.where", note="Piecewise((a, cond), ..., (b, True))"),
        Entry("where", _where, (3,), "torch.where(cond, a, b)", note="where(cond, a, b) is Piecewise((a, cond), (b, True))"),
        _unary("Heaviside", sympy.Heaviside, "torch.sign", note="Heaviside(0) = 1/2, as SymPy"),
        _unary("floor", sympy.floor, "torch.floor"),
        _unary("ceiling", sympy.ceiling, "torch.ceil"),
        _unary("round", round_half_even, "torch.round", note="halves to even; gradient 0, so pair with --grad x=1"),
        _unary("erf", sympy.erf, "torch.special.erf"),
        _unary("erfc", sympy.erfc, "torch.special.erfc"),
        _unary("gamma", sympy.gamma, "torch.lgamma + sign", note="exp(lgamma(x)) with the sign of gamma"),
        _unary("loggamma", sympy.loggamma, "torch.lgamma", POSITIVE),
        _unary("digamma", sympy.digamma, "torch.special.digamma"),
        # Stable functions (symgrad.math.functions); symgrad also rewrites their naive
        # spellings (log(1+exp(x)), 1/(1+exp(-x)), ...) into them.
        _unary("sigmoid", sigmoid, "torch.sigmoid", note="1/(1+exp(-x)); its gradient stays exact in the tails"),
        _unary("softplus", softplus, "torch.nn.functional.softplus", note="log(1+exp(x)), threshold 40"),
        _unary("ndtr", ndtr, "0.5 * torch.special.erfc(-x/sqrt(2))", note="the normal CDF (1+erf(x/sqrt(2)))/2"),
        _unary("log_ndtr", log_ndtr, "torch.special.log_ndtr", note="log(ndtr(x)); finite in both tails"),
        _unary("erfcx", erfcx, "torch.special.erfcx", note="exp(x**2)*erfc(x); finite for large x"),
        Entry("logaddexp", logaddexp, (2,), "torch.logaddexp", note="log(exp(a)+exp(b))"),
        Entry("hypot", hypot, (2,), "torch.hypot", note="sqrt(a**2+b**2)"),
        Entry("xlogy", xlogy, (2,), "torch.xlogy", note="x*log(y), 0 where x = 0"),
        # Row-wise functions are built by the parser itself (their dim is a literal, not an
        # expression): symgrad.math.reductions. Inside an expression a reduction keeps its
        # dims; sum(e) and mean(e) without a dim reduce the whole tensor.
        Entry("sum", lambda arg: arg, (1, 2), "torch.sum", note="sum(e) whole-tensor; sum(e, dim)"),
        Entry("mean", lambda arg: arg, (1, 2), "torch.mean", note="mean(e) whole-tensor; mean(e, dim)"),
        Entry("amax", lambda arg: arg, (1, 2), "torch.amax", note="amax(e, dim); ties share the gradient"),
        Entry("amin", lambda arg: arg, (1, 2), "torch.amin", note="amin(e, dim); ties share the gradient"),
        Entry("logsumexp", lambda arg: arg, (1, 2), "torch.logsumexp", note="logsumexp(e, dim)"),
        Entry("norm", lambda arg: arg, (1, 2), "torch.linalg.vector_norm", note="the 2-norm, norm(e, dim)"),
        Entry("softmax", lambda arg: arg, (2,), "torch.softmax", note="softmax(e, dim), one dim"),
        Entry("log_softmax", lambda arg: arg, (2,), "torch.log_softmax", note="log_softmax(e, dim), one dim"),
        Entry("gather", lambda arg: arg, (2,), "torch.gather", note="gather(e, t): e[..., t] along the last dim"),
        Entry("chunk", lambda arg: arg, (3,), "Tensor.unflatten", note="chunk(x, n, i): the i-th of n equal chunks along the last dim"),
    )
}

REDUCTIONS = ("sum", "mean")  # the whole-output reductions of the elementwise path
ROW_FUNCTIONS = ("sum", "mean", "amax", "amin", "logsumexp", "norm", "softmax", "log_softmax", "gather", "chunk")

# Named constants users may write. Everything else that is a bare name is a symbol.

CONSTANTS: dict[str, sympy.Expr] = {"pi": sympy.pi, "E": sympy.E}

# Names SymPy users might expect, but that make no sense for real tensors: rejected with
# a reason rather than silently becoming a symbol.

REJECTED_NAMES: dict[str, str] = {
    "I": "the imaginary unit I is not supported: symgrad works over the real numbers",
    "oo": "infinity (oo) is not supported: expressions must be finite",
    "zoo": "complex infinity (zoo) is not supported: expressions must be finite",
    "nan": "nan is not supported: expressions must be finite",
    "inf": "inf is not supported: expressions must be finite",
}
