"""Constants as the generated code writes them: float numbers, integers kept exact."""

from __future__ import annotations

import sympy

from ..errors import SymgradError
from .rounding import round_half_even


def numbers_to_floats(expr: sympy.Basic) -> sympy.Basic:
    """Constant subexpressions other than integers become 17-digit Floats, except in
    exponents (``x**(1/3)`` stays a root).

    A Python float follows the tensors' dtype and device, while ``torch.sqrt(10)`` would
    be a TypeError. Like ``sympy.nfloat(exponent=False)``, which fails on And/Or conditions.
    """
    if isinstance(expr, sympy.Expr) and expr.is_number and not expr.is_Integer and not expr.is_Float:
        value = expr.evalf(17)
        try:
            return sympy.Float(value, 17)
        except (TypeError, ValueError):
            if value.has(sympy.I):
                # (-1)**(1/3) would print as Python code that makes a complex number.
                raise SymgradError(
                    f"the constant {expr} has a complex value, and symgrad works over the real numbers"
                ) from None
            return expr  # zoo or nan: printed as nan
    if expr.is_Atom or not expr.args:
        return expr
    if expr.is_Pow:
        exponent = expr.exp if expr.exp.is_Rational else numbers_to_floats(expr.exp)
        return sympy.Pow(numbers_to_floats(expr.base), exponent)
    args = tuple(numbers_to_floats(a) for a in expr.args)
    if args == expr.args:
        return _without_unit_coefficient(expr)
    try:
        return _without_unit_coefficient(expr.func(*args))
    except ValueError:
        # Min/Max of an argument that SymPy finds not real once its constants are floats
        # (asin(x**2 + 3.14...) is complex for every x).
        unreal = [a for a in args if isinstance(a, sympy.Expr) and a.is_extended_real is False]
        if isinstance(expr, (sympy.Min, sympy.Max)) and unreal:
            raise SymgradError(
                f"{type(expr).__name__} compares {unreal[0]}, which is not a real number for any input"
            ) from None
        raise


def _without_unit_coefficient(expr: sympy.Basic) -> sympy.Basic:
    """``1.0*x*f(x)`` as ``x*f(x)`` (``-1.0*...`` as ``-...``), where ``f`` certainly makes the
    product floating: SymPy keeps a Float coefficient of 1, which would print, and run, as a
    multiplication (GELU written ``0.5*x*(1 + erf(x/sqrt(2)))`` is ``1.0*x*ndtr(x)`` once
    stabilised: one kernel more in forward and in backward). Elsewhere the 1.0 stays: it is
    what makes ``1.0*x**2`` of an integer ``x`` float32, as in eager torch."""
    if expr.is_Mul:
        coefficient, rest = expr.as_coeff_Mul()
        unit = coefficient.is_Float and abs(float(coefficient)) == 1.0  # (SymPy: Float(1) != 1)
        if unit and any(_floating_factor(f) for f in sympy.Mul.make_args(rest)):
            return rest if coefficient > 0 else -rest
    return expr


# SymPy's functions whose torch spelling keeps an integer or bool tensor's dtype (symgrad's
# own functions say so themselves: StableFunction.keeps_dtype).

_DTYPE_KEEPING = (sympy.Abs, sympy.sign, sympy.floor, sympy.ceiling, round_half_even, sympy.Min, sympy.Max)


def _floating_factor(factor: sympy.Basic) -> bool:
    """Whether torch computes ``factor`` as a floating-point tensor whatever the inputs' dtype:
    a transcendental function, or a power that prints with a float exponent."""
    if isinstance(factor, sympy.Function):
        return not (isinstance(factor, _DTYPE_KEEPING) or getattr(factor, "keeps_dtype", False))
    return factor.is_Pow and not (factor.exp.is_Integer and factor.exp >= 0)
