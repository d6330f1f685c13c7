"""Exact evaluation for the probes: SymPy expressions as mpmath code that refuses what
float64 could not hold.

derive's domain, accuracy and second-derivative probes and stable's Piecewise guard all
evaluate candidate forms at chosen points; this is the one evaluator they share.
"""

from __future__ import annotations

import functools
import math
import types

import mpmath
import sympy
from sympy.printing.pycode import MpmathPrinter


FLOAT64_MAX = 1.7976931348623157e308
_FLOAT64_MAX_MPF = mpmath.mpf(FLOAT64_MAX)


# Probe evaluation is in mpmath, whose cost grows with the size of an exponent: sinh of
# sinh(sinh(30)) (about e**(5e12)) would never finish. Values
# that large are far outside float64 anyway, so the exponential functions and powers
# refuse them (OverflowError, i.e. "not moderate") instead of computing them.

PROBE_MAX_EXPONENT = 1e5
PROBE_MAX_TRIG_ARGUMENT = 1e300  # beyond float64; reducing sin(1e43429) would need a 144k-bit pi
PROBE_MAX_SPECIAL_ARGUMENT = 1e300  # loggamma, polygamma (beyond float64 they are inf or nan anyway)
PROBE_MAX_NEGATIVE_POLYGAMMA = 1e4  # below -1e4, see _probe_polygamma


def _guard(fn, size, limit):
    # (An mpf compares with an mpf, and a float with a float, without a conversion per call.)
    limits = {float: float(limit), mpmath.mpf: mpmath.mpf(limit)}

    def guarded(*args):
        magnitude = size(*args)
        if not magnitude <= limits.get(type(magnitude), limit):  # (nan too)
            raise OverflowError(f"{fn.__name__} argument too large to probe")
        return fn(*args)

    return guarded


def _probe_polygamma(order, argument):
    """mpmath's polygamma, refusing arguments it would take minutes over.

    Below 0 it recurs up to positive arguments one unit at a time: 3 s at -1e6, minutes at
    -2e7 (trigamma in a domain probe).
    """
    if not abs(argument) <= PROBE_MAX_SPECIAL_ARGUMENT or mpmath.re(argument) < -PROBE_MAX_NEGATIVE_POLYGAMMA:
        raise OverflowError("polygamma argument too large to probe")
    return REMEMBERED["polygamma"](order, argument)


def _power_size(base, exponent):
    """A bound on the size of the exponent of base**exponent (|exponent * log(base)|),
    where that is below PROBE_MAX_EXPONENT; else the size itself."""
    if base == 0:
        return 0.0
    # mag(base) is within 2 of log2|base| and needs no logarithm, which was a third of the
    # probes' time (and a number exponent, x**2, needs no mpf arithmetic); where this bound
    # is too large the logarithm decides, as before.
    if isinstance(exponent, (int, float, mpmath.mpf)):
        bound = abs(float(exponent)) * (abs(mpmath.mag(base)) + 2) * 0.7  # (0.7 > ln 2)
        if bound <= PROBE_MAX_EXPONENT:
            return bound
    return abs(exponent) * abs(mpmath.log(abs(base))) + abs(mpmath.im(exponent))


def remembered(fn):
    """``fn``, remembering its value for each argument tuple at each working precision.

    Some special functions cost tens of milliseconds at the probes' highest precision
    (2048 bits, after a first call: erf(30) 33 ms, erfc(30) 29 ms, digamma(30) and
    ncdf(-30) 14 ms, against 0.15 ms for sin(30)), and a constant call such as erf(30) is
    evaluated again at every probe point of every candidate form: generating
    ``hypot(...)**(erf(30)**y)`` made 24,763 erf calls, 111 s of its
    119 s under a profiler. Remembered, each constant costs one evaluation per precision
    (that expression: 4 s from the command line, was 110). The value is the one ``fn``
    gives: the key holds the precision, and the arguments' types (``typed``: mpf(30) and
    mpc(30, 0) are equal keys, but erf returns an mpf for one and an mpc for the other).
    Exceptions are not remembered, so they are raised again each time.
    """

    @functools.lru_cache(maxsize=1024, typed=True)
    def at_precision(precision, *args):
        return fn(*args)

    @functools.wraps(fn)
    def remembering(*args):
        try:
            hash(args)
        except TypeError:
            return fn(*args)
        return at_precision(mpmath.mp.prec, *args)

    remembering.cache_info, remembering.cache_clear = at_precision.cache_info, at_precision.cache_clear
    return remembering


# The costly ones (see remembered), for the probe code and for the mpmath implementations of
# symgrad.math.functions (ndtr(30) took as long as erf(30)).

REMEMBERED = {name: remembered(getattr(mpmath, name)) for name in ("erf", "erfc", "ncdf", "polygamma")}

_PROBE_NAMESPACE = {
    **{name: _guard(getattr(mpmath, name), lambda a: abs(a), PROBE_MAX_EXPONENT)
       for name in ("exp", "expm1", "sinh", "cosh", "gamma")},
    "erf": REMEMBERED["erf"],
    "erfc": REMEMBERED["erfc"],
    **{name: _guard(getattr(mpmath, name), lambda a: abs(a), PROBE_MAX_TRIG_ARGUMENT)
       for name in ("sin", "cos", "tan", "sec", "csc", "cot")},
    # Beyond float64's range these are inf or nan in the generated code anyway, and mpmath
    # may take long over them (see _probe_polygamma).
    "loggamma": _guard(mpmath.loggamma, lambda a: abs(a), PROBE_MAX_SPECIAL_ARGUMENT),
    "polygamma": _probe_polygamma,
    "_probe_power": _guard(mpmath.power, _power_size, PROBE_MAX_EXPONENT),
    "_probe_heaviside": lambda x, h0=mpmath.mpf(0.5): mpmath.mpf(0) if x < 0 else (h0 if x == 0 else mpmath.mpf(1)),
}  # fmt: skip

# What evaluating probe code may raise, each meaning "no real, finite value here": a complex
# or float64-overflowing intermediate (real_only: ValueError, OverflowError), a value too
# large to probe (OverflowError), a pole (ZeroDivisionError), mpmath's atan2 of a complex
# value (AttributeError), a comparison of complex values (TypeError), a series that does
# not converge (NoConvergence), a name the printer left unknown (NameError), and a number
# too large to hold (MemoryError). One list for every probe.

PROBE_FAILURES = (ArithmeticError, ValueError, TypeError, AttributeError, NameError, MemoryError, mpmath.libmp.NoConvergence)


class _ProbePrinter(MpmathPrinter):
    """mpmath code in which every power goes through the guarded ``_probe_power``."""

    def _print_Pow(self, expr, rational=False):
        return f"_probe_power({self._print(expr.base)}, {self._print(expr.exp)})"

    # Printed directly: SymPy's own printing may rewrite Max/Min and logic into Piecewise and
    # conjunctive normal form, which is exponential in the number of conditions (a hang on
    # Min(Max(...), Min(...), gamma(log(y)) < 0)).
    def _print_Heaviside(self, expr):
        return f"_probe_heaviside({self._print(expr.args[0])})"

    def _print_Max(self, expr):
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr):
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_And(self, expr):
        return "(" + " and ".join(self._print(a) for a in expr.args) + ")"

    def _print_Or(self, expr):
        return "(" + " or ".join(self._print(a) for a in expr.args) + ")"

    def _print_Not(self, expr):
        return f"(not {self._print(expr.args[0])})"

    def _print_ITE(self, expr):
        # (ITE: a condition that compares conditions. SymPy's printer rewrites it as a
        # Piecewise, whose folding ran for minutes on a few nested ones:.)
        condition, then, otherwise = (self._print(a) for a in expr.args)
        return f"(({then}) if ({condition}) else ({otherwise}))"

    def _print_ComplexRootOf(self, expr):
        # A root of a polynomial, where SymPy solved a Piecewise condition (x > x**4/2 - 1/2
        # became a root interval): its value.
        value = expr.evalf(30)
        if not value.is_real:
            raise TypeError("a complex root in a condition")
        return f"mpf('{value}')"

    def _print_Piecewise(self, expr):
        text = "mpf('nan')"
        for value, condition in reversed(expr.args):
            if condition == sympy.true:
                text = self._print(value)
            else:
                text = f"(({self._print(value)}) if ({self._print(condition)}) else ({text}))"
        return text


def _probe_printer() -> _ProbePrinter:
    # The settings lambdify itself uses for modules="mpmath" (sympy 1.14).
    names = {name: name for name in _PROBE_NAMESPACE}
    settings = {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True}
    return _ProbePrinter({**settings, "user_functions": names})


def probe_code(symbols, exprs):
    """mpmath code of ``exprs`` (an expression or a list) in ``symbols``, as the probes run it."""
    return sympy.lambdify(symbols, exprs, modules=[_PROBE_NAMESPACE, "mpmath"], printer=_probe_printer())


def real_only(evaluate):
    """Make every function the probe code calls refuse a complex result.

    torch computes over the reals: acos(y)**2 is NaN for y > 1, although in mpmath the
    complex acos squares to a real number. A complex
    intermediate is therefore "not moderate", like an infinite one, and so is one beyond
    float64's range.
    """
    return wrap_probe_calls(evaluate, lambda name, function: _real_result(function))


def wrap_probe_calls(evaluate, wrap):
    """Replace every function that the probe code ``evaluate`` calls by ``wrap(name, function)``."""
    namespace = evaluate.__globals__
    functions = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType)
    for name, value in list(namespace.items()):
        # Only functions: mpmath's constants (pi, e, euler) are callable objects too.
        if name.startswith("_") and name != "_probe_power" or not isinstance(value, functions):
            continue
        namespace[name] = wrap(name, value)
    return evaluate


def _real_result(fn):
    def real(*args):
        value = fn(*args)
        if isinstance(value, mpmath.mpc):
            if value.imag != 0:
                raise ValueError("complex intermediate value")
            value = value.real
        if isinstance(value, mpmath.mpf) and abs(value) > _FLOAT64_MAX_MPF:
            # float64 overflows here even if the end result is moderate in mpmath:
            # ((7 + y)**1095)**(y - 1) is inf**... in torch
            raise OverflowError("intermediate value beyond float64")
        return value

    return real


def moderate(value, largest: float) -> bool:
    """Whether a probe's ``value`` is real, finite and at most ``largest`` in size."""
    try:
        number = complex(value)
    except (TypeError, ValueError):
        return False
    return number.imag == 0 and math.isfinite(number.real) and abs(number.real) <= largest
