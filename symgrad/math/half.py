"""Whether an expression computed op by op in float16 stays within the float16 contract.

Eager float16 rounds after every operation, and an intermediate overflows float16 (above
65504) long before a value does: cube's gradient 3*x**2*g is finite for x = 300 and
g = 0.01, but x**2 is inf in float16. Where that happens, the planner computes the body
in float32 and rounds once (symgrad.plan.dtype); where it does not, the body runs in
float16 as written, without conversions.

The evidence is an emulation: each SymPy node is evaluated in float64 from its children's
float16 values and rounded to float16 (one ATen kernel, which computes in float32 and
rounds once), at points across float16's range, and compared with the exact value
(mpmath, as :mod:`.probe` evaluates) rounded to float16.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from collections.abc import Mapping, Sequence

import mpmath
import sympy

from .probe import PROBE_FAILURES, probe_code, real_only

HALF_MAX = 65504.0
# The float16 contract (tests/test_generated.py): 4 units of float16's rounding.
CONTRACT_UNITS = 4
_HALF_EPS = 2.0**-10

# Input magnitudes, log-spaced across float16's range, both signs.
_MAGNITUDES = (1e-3, 0.1, 0.5, 1.0, 2.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1e3, 1e4, 6e4)
_COARSE_MAGNITUDES = (1e-3, 0.5, 3.0, 30.0, 300.0, 1e4)
# Beyond these the probes would cost seconds (points grow as a power of the symbols, exact
# evaluation with the size): such a body computes in float32 without being probed.
MAX_SYMBOLS = 4
MAX_OPERATIONS = 40


def to_half(value: float) -> float:
    """``value`` rounded to float16 (inf beyond its range, nan stays nan)."""
    try:
        return struct.unpack("e", struct.pack("e", value))[0]
    except OverflowError:  # (past 65504 once rounded)
        return math.copysign(math.inf, value)


# Upstream gradients and tangents: 1, and small and large ones, which overflow or
# underflow in a product that the exact value does not; as float16 holds them.
_SCALES = tuple(to_half(s) for s in (1.0, 1e-2, 1e2))


def _div(a: float, b: float) -> float:
    """a / b in IEEE arithmetic (Python raises on a zero divisor)."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _pow(base: float, exponent: float) -> float:
    """base**exponent in IEEE arithmetic: overflow is inf, a complex result nan."""
    try:
        value = base**exponent
    except ZeroDivisionError:  # (0 to a negative power: inf, -inf for -0.0 to an odd one)
        odd = float(exponent).is_integer() and exponent % 2 == 1
        return math.copysign(math.inf, base) if odd else math.inf
    except OverflowError:
        return math.inf if base > 0 or float(exponent).is_integer() and exponent % 2 == 0 else -math.inf
    return math.nan if isinstance(value, complex) else float(value)


# Functions that print as one ATen kernel of their argument, as emulated here. Any other node
# (Piecewise, guards, Max, sign, ...) prints as several operations or a torch.where, which
# the emulation does not model: the body is then computed in float32.
ONE_KERNEL_FUNCTIONS = frozenset(
    {"exp", "log", "sin", "cos", "tan", "tanh", "sinh", "cosh", "atan", "asin", "acos", "erf", "erfc", "Abs"}
    | {"log1p", "expm1", "sigmoid", "softplus"}
)


class Unsupported(Exception):
    """The emulation has no rule for a node (it is then taken to need float32)."""


@functools.lru_cache(maxsize=None)
def _exact_function(func) -> object:
    """mpmath code for ``func`` of one or more arguments (a SymPy function class)."""
    arguments = sympy.symbols("a0:4", real=True)
    for arity in range(1, 5):
        try:
            expr = func(*arguments[:arity])
        except (TypeError, ValueError):
            continue
        return arity, real_only(probe_code(arguments[:arity], expr))
    raise Unsupported(func)


def emulate(expr: sympy.Expr, values: Mapping[sympy.Symbol, float]) -> float:
    """``expr`` computed op by op in float16 from ``values`` (already float16)."""
    if expr.is_Symbol:
        return values[expr]
    if expr.is_Number:
        return float(expr)  # (a Python scalar beside a tensor: not rounded on its own)
    if expr.is_Add:
        terms = list(expr.args)
        total = emulate(terms[0], values)
        for term in terms[1:]:
            coefficient, rest = term.as_coeff_Mul()
            if coefficient == -1:
                total = to_half(total - emulate(rest, values))
            else:
                total = to_half(total + emulate(term, values))
        return total
    if expr.is_Mul:
        coefficient, rest = expr.as_coeff_Mul()
        numerator, denominator = [], []
        for factor in sympy.Mul.make_args(rest):
            base, exponent = factor.as_base_exp()
            if exponent.is_Number and exponent < 0:
                denominator.append(base if exponent == -1 else base ** (-exponent))
            else:
                numerator.append(factor)
        if numerator:
            value = emulate(numerator[0], values)
            if coefficient != 1:
                value = to_half(float(coefficient) * value)
        else:
            value = float(coefficient)
        for factor in numerator[1:]:
            value = to_half(value * emulate(factor, values))
        if denominator:
            # The printer writes one division by the denominator's product (2 / (x * y)),
            # whose product can overflow or underflow on its own.
            divisor = emulate(denominator[0], values)
            for factor in denominator[1:]:
                divisor = to_half(divisor * emulate(factor, values))
            value = to_half(_div(value, divisor))
        return value
    if expr.is_Pow:
        base, exponent = expr.args
        if not exponent.is_Number:
            raise Unsupported(expr)
        return to_half(_pow(emulate(base, values), float(exponent)))
    if type(expr).__name__ in ONE_KERNEL_FUNCTIONS:
        arity, evaluate = _exact_function(expr.func)
        if arity != len(expr.args):
            raise Unsupported(expr)
        arguments = [emulate(a, values) for a in expr.args]
        if not all(math.isfinite(a) for a in arguments):
            return math.nan if any(math.isnan(a) for a in arguments) else _at_infinity(type(expr).__name__, arguments)
        try:
            with mpmath.workprec(64):
                return to_half(float(evaluate(*arguments)))
        except PROBE_FAILURES:
            return math.nan
    raise Unsupported(expr)


# Each one-kernel function in IEEE float arithmetic, for an argument that is already inf in
# float16 (an intermediate that overflowed): what the kernel returns there, e.g. exp(-inf) = 0,
# sigmoid(inf) = 1, sin(inf) = nan.
_IEEE = {
    "exp": math.exp,
    "log": math.log,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "tanh": math.tanh,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "atan": math.atan,
    "asin": math.asin,
    "acos": math.acos,
    "erf": math.erf,
    "erfc": math.erfc,
    "Abs": math.fabs,
    "log1p": math.log1p,
    "expm1": math.expm1,
    "sigmoid": lambda u: 1.0 if u > 0 else 0.0,
    "softplus": lambda u: u if u > 0 else 0.0,
}


def _at_infinity(name: str, arguments: Sequence[float]) -> float:
    """A one-kernel function of an infinite argument, as IEEE arithmetic gives it (nan where
    the function has no limit there, or for arguments outside its domain)."""
    try:
        return to_half(_IEEE[name](*arguments))
    except ValueError:  # (sin(inf), log(-inf), asin(inf))
        return math.nan
    except OverflowError:
        return math.inf


def _units_off(got: float, want: float) -> float:
    """How many units of float16's rounding (eps relative to ``want``) ``got`` is from
    ``want`` (both float16). Relative even below float16's smallest normal number: a
    subnormal gradient one step off (2% at 1e-6) breaks the contract as the tests state it."""
    if got == want:
        return 0.0
    if not math.isfinite(got) or want == 0:
        return math.inf
    return abs(got - want) / (abs(want) * _HALF_EPS)


def _exact(evaluate, point: Sequence[float]) -> float | None:
    """The exact value at ``point`` rounded to float16, or None where it is not a finite
    real in float16's range (widening cannot help there: it rounds to inf too)."""
    try:
        with mpmath.workprec(80):
            value = evaluate(*point)
        value = float(value)
    except (*PROBE_FAILURES, OverflowError):
        return None
    half = to_half(value)
    return half if math.isfinite(half) else None


def points(symbols: Sequence[sympy.Symbol], scaled: frozenset[sympy.Symbol] = frozenset()):
    """Probe points: log-spaced magnitudes of both signs for each symbol (coarser for
    several), and for the ``scaled`` ones (upstream gradients, tangents) the scales."""
    plain = [s for s in symbols if s not in scaled]
    magnitudes = _MAGNITUDES if len(plain) == 1 else _COARSE_MAGNITUDES
    signed = tuple(to_half(m * sign) for m in magnitudes for sign in (1.0, -1.0))
    axes = [_SCALES if s in scaled else signed for s in symbols]
    return itertools.product(*axes)


def loses_in_float16(
    expr: sympy.Expr,
    symbols: Sequence[sympy.Symbol],
    scaled: frozenset[sympy.Symbol] = frozenset(),
    stored: Mapping[sympy.Symbol, sympy.Expr] | None = None,
) -> bool:
    """Whether ``expr`` of ``symbols``, computed op by op in float16, is more than
    CONTRACT_UNITS off the exact value rounded to float16, or inf/nan where that is finite,
    at some probe point.

    ``stored``: symbols that stand for a tensor forward computed (the output a gradient is
    written in), as their expressions of ``symbols``; the emulation reads them rounded to
    float16, as they are saved.
    """
    if len(symbols) > MAX_SYMBOLS or sympy.count_ops(expr) > MAX_OPERATIONS:
        return True
    stored = {symbol: e for symbol, e in (stored or {}).items() if symbol in expr.free_symbols}
    truth_expr = expr.subs(stored) if stored else expr
    try:
        exact = real_only(probe_code(list(symbols), truth_expr))
        saved = {s: real_only(probe_code(list(symbols), e)) for s, e in stored.items()}
    except Exception:  # (nothing mpmath can print: decide for float32)
        return True
    compared = 0
    for point in points(symbols, scaled):
        want = _exact(exact, point)
        if want is None:
            continue
        inputs = dict(zip(symbols, point))
        # A saved output is the exact value rounded where forward ran in float32, or forward's
        # own float16 computation: the body must hold with either.
        exact_saved = {symbol: _exact(evaluate, point) for symbol, evaluate in saved.items()}
        if any(value is None for value in exact_saved.values()):
            continue
        try:
            emulated_saved = {symbol: emulate(stored[symbol], inputs) for symbol in saved}
            for saved_values in (exact_saved, emulated_saved) if saved else ({},):
                got = emulate(expr, {**inputs, **saved_values})
                if _units_off(got, want) > CONTRACT_UNITS:
                    return True
        except Unsupported:
            return True
        compared += 1
    return compared == 0  # (no point to compare at is no evidence: float32)
