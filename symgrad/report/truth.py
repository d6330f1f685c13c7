"""The exact values and derivatives a report measures against: the formula as parsed,
differentiated by SymPy and evaluated by mpmath until two precisions agree.

It shares nothing with symgrad's derivation or rewriting: ``sympy.diff`` of the parsed
expression, ``lambdify`` to mpmath, and more digits where the formula cancels.
"""

from __future__ import annotations

import math
from typing import Sequence

import mpmath
import sympy

# Digits tried in turn until two successive precisions agree to AGREE relative digits.
PRECISIONS = (30, 60, 120, 240, 480)
AGREE = 20

# Piecewise-constant functions: their derivative (and DiracDelta) is 0 wherever it exists.
_STEPS = (sympy.floor, sympy.ceiling, sympy.sign, sympy.Heaviside)

_FAILURES = (ArithmeticError, ValueError, TypeError, NameError, mpmath.libmp.NoConvergence)


class Truth:
    """Exact values of one output and its derivative along one input, at float points.

    Args:
        expr: the output's elementwise expression.
        symbols: the symbols the points give values for (inputs, then params).
        along: the symbol the derivative is taken along.
    """

    def __init__(self, expr: sympy.Expr, symbols: Sequence[sympy.Symbol], along: sympy.Symbol) -> None:
        derivative = sympy.diff(expr, along).replace(
            lambda e: isinstance(e, sympy.Derivative) and isinstance(e.expr, _STEPS), lambda e: sympy.S.Zero
        ).replace(sympy.DiracDelta, lambda *args: sympy.S.Zero)
        if derivative.has(sympy.Derivative):
            derivative = sympy.nan  # SymPy has no closed form: not measured
        self._evaluate = sympy.lambdify(list(symbols), [expr, derivative], modules="mpmath")
        self._along = list(symbols).index(along)

    def at(self, point: Sequence[float]) -> tuple[float, float]:
        """(value, derivative) at ``point``, rounded to float64; nan where either is not real
        and finite (outside the domain, or at a pole). At a removable singularity (0/0 at
        the point itself) the limit, from both sides."""
        exact = self._converged(point)
        if exact is None:
            exact = self._limit(point)
        if exact is None:
            return math.nan, math.nan
        return tuple(float(v) for v in exact)

    def _converged(self, point: Sequence[float], shift: float = 0.0) -> tuple | None:
        previous = None
        for digits in PRECISIONS:
            values = self._values_at(point, shift, digits)
            if values is None:
                return None
            if previous is not None and all(_agree(a, b) for a, b in zip(previous, values)):
                if any(v == 0 for v in values) and digits < PRECISIONS[-1]:
                    # A zero may be total cancellation at both precisions (log(1+exp(x)) at
                    # x = -200 is 0 at 60 digits): only the most digits decide it, and a value
                    # still 0 there is below float64's smallest number anyway.
                    return self._values_at(point, shift, PRECISIONS[-1])
                return values
            previous = values
        return None

    def _values_at(self, point: Sequence[float], shift: float, digits: int) -> tuple | None:
        with mpmath.workdps(digits):
            args = [mpmath.mpf(p) for p in point]
            if shift:
                args[self._along] += mpmath.mpf(shift)
            return self._values(args)

    def _values(self, args: list) -> tuple | None:
        try:
            values = self._evaluate(*args)
        except _FAILURES:
            return None
        out = []
        for value in values:
            value = mpmath.mpmathify(value)
            if isinstance(value, mpmath.mpc):
                if value.imag != 0:
                    return None
                value = value.real
            if not mpmath.isfinite(value):
                return None
            out.append(value)
        return tuple(out)

    def _limit(self, point: Sequence[float]) -> tuple | None:
        """The two one-sided values a tiny step away, where they agree (sin(x)/x at 0)."""
        step = 1e-40 * max(1.0, abs(point[self._along]))
        left, right = self._converged(point, -step), self._converged(point, step)
        if left is None or right is None:
            return None
        # (Odd parts differ by about step times the next derivative: 1e-40 apart, not a jump.)
        if not all(_agree(a, b, digits=12) or abs(a - b) < 1e-30 for a, b in zip(left, right)):
            return None
        return tuple((a + b) / 2 for a, b in zip(left, right))


def _agree(a, b, digits: int = AGREE) -> bool:
    scale = max(abs(a), abs(b))
    return scale == 0 or abs(a - b) <= scale * mpmath.mpf(10) ** (-digits)
