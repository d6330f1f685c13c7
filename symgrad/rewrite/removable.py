"""Removable singularities found in an expression: at 0 of a symbol (``sin(x)/x``,
``expm1(x)/x``) or at a dyadic point where a denominator vanishes (``log(x)/(x - 1)`` at 1),
replaced by a :func:`~symgrad.math.series.removable` function.
"""

from __future__ import annotations

import functools

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from ..math.functions import to_elementary
from ..math.series import Removable, removable
from .patterns import _number


# -- removable singularities ------------------------------------------------------------

def _singular_points(expr: sympy.Expr) -> list[tuple[sympy.Symbol, sympy.Rational]]:
    """Pairs ``(x, c)`` of a symbol and a point at which a denominator in ``expr`` vanishes
    (``x**-k`` and ``1/sin(x)`` at 0, ``1/(x - 1)`` at 1): candidates for a removable
    singularity at ``x = c``."""
    found = set()
    for p in sympy.preorder_traversal(expr):
        if p.is_Pow and _number(p.exp) and p.exp.is_negative:
            found.update(_vanishing_points(p.base))
    return sorted(found, key=sympy.default_sort_key)


_DYADIC_CENTER_DENOMINATOR = 2**10  # centers are dyadic: x - c is then exact near c


@functools.lru_cache(maxsize=4096)
def _vanishing_points(base: sympy.Expr) -> tuple[tuple[sympy.Symbol, sympy.Rational], ...]:
    """Where a one-symbol ``base`` vanishes: at 0 (numerically), and at the dyadic zeros
    _dyadic_zeros finds. (A root like 1/3 is not a float: x - 1/3 would not be the exact
    distance to it, nor the series in it exact.)"""
    if base.is_Symbol:
        return ((base, sympy.Integer(0)),)
    if len(base.free_symbols) != 1 or sympy.count_ops(base) > 20:
        return ()
    (x,) = base.free_symbols
    points = []
    try:
        # Numerically: an exact xreplace builds the value symbolically, and SymPy's
        # Pow of a complex constant (1 - acos(0)**2)**(-1/2) ran for minutes deciding
        # its sign. A false "vanishes" only costs a try:
        # removable() checks the limit itself.
        value = to_elementary(base).evalf(30, subs={x: sympy.Integer(0)})
        vanishes = bool(value.is_zero) or (value.is_Float and abs(value) < 1e-25)
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        # e.g. Max(zoo, ...) at 0; and SymPy's evalf of cos(log(y)**tanh(E)) at y = 0
        # raised AttributeError ('NoneType' object has no attribute 'subs')
        vanishes = False
    if vanishes:
        points.append((x, sympy.Integer(0)))
    points.extend((x, root) for root in _dyadic_zeros(base, x) if root != 0)
    return tuple(points)


# Functions that vanish at 0: f(u) vanishes where u does (sin and tan elsewhere too, at
# multiples of pi, which no float holds: not centers).

_ZERO_AT_ZERO = (sympy.sin, sympy.tan, sympy.sinh, sympy.tanh, sympy.atan, sympy.asin, sympy.asinh, sympy.atanh, sympy.erf, expm1, log1p)


def _dyadic_zeros(expr: sympy.Expr, x: sympy.Symbol) -> set[sympy.Rational]:
    """Dyadic points at which ``expr`` vanishes, found by its structure: a polynomial's
    rational roots (degree 4 at most), ``log(p)`` where ``p = 1``, ``sin(p)`` (and other
    functions zero only at 0) where ``p = 0``, and the factors of a product or power."""
    if expr.is_Mul:
        return set().union(*(_dyadic_zeros(factor, x) for factor in expr.args))
    if expr.is_Pow and _number(expr.exp) and expr.exp.is_positive:
        return _dyadic_zeros(expr.base, x)
    if isinstance(expr, sympy.log):
        return _dyadic_zeros(expr.args[0] - 1, x)
    if isinstance(expr, _ZERO_AT_ZERO):
        return _dyadic_zeros(expr.args[0], x)
    if not expr.is_polynomial(x):
        return set()
    poly = sympy.Poly(expr, x)
    if not (poly.domain.is_QQ or poly.domain.is_ZZ) or not 1 <= poly.degree() <= 4:
        return set()
    return {
        root
        for root in sympy.roots(poly, filter="Q")
        if root.q <= _DYADIC_CENTER_DENOMINATOR and root.q & (root.q - 1) == 0
    }


# Functions that grow like exp(|z|) or exp(|z|**2) off the real axis, where the Cauchy
# integrals of series.removable evaluate them.

_EXPLOSIVE = (sympy.exp, expm1, sympy.sinh, sympy.cosh, sympy.gamma, sympy.erf, sympy.erfc, sympy.sin, sympy.cos, sympy.tan)


def _explosive(expr: sympy.Expr) -> bool:
    """Whether probing near 0 could need astronomically large numbers: an exp-like
    function of a negative power or of another exp-like function (``cosh(cosh(9/x))``
    at x = 1e-12, or ``erf(erf(erf(x)))`` on a complex circle, would make mpmath run out
    of memory or time)."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, _EXPLOSIVE):
            for inner in sympy.preorder_traversal(node.args[0]):
                if isinstance(inner, _EXPLOSIVE) or (inner.is_Pow and inner.exp.is_negative):
                    return True
    return False


def _removable_singularities(expr: sympy.Expr) -> sympy.Expr:
    if not isinstance(expr, sympy.Expr) or expr.is_Atom or not _singular_points(expr) or _explosive(expr):
        return expr
    if isinstance(expr, Removable):
        return expr
    for x, center in _singular_points(expr):
        if expr.is_Add or expr.is_Mul:
            parts = expr.args
            if expr.is_Add:
                group = [t for t in parts if t.free_symbols == {x} and (x, center) in _singular_points(t)]
            else:
                group = [t for t in parts if t.free_symbols == {x}]
            if group and any((x, center) in _singular_points(t) for t in group):
                candidate = expr.func(*group)
                made = removable(candidate, x, center)
                if made is not None:
                    others = [t for t in parts if t not in group]
                    return expr.func(made(x), *(_removable_singularities(t) for t in others))
        elif expr.free_symbols == {x}:
            made = removable(expr, x, center)
            if made is not None:
                return made(x)
    args = tuple(_removable_singularities(a) if isinstance(a, sympy.Expr) else a for a in expr.args)
    return expr.func(*args) if args != expr.args else expr
