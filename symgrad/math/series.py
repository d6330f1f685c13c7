"""Removable singularities as functions: :func:`removable` makes a :class:`Removable`
``f(x)`` for an expression such as ``sin(x)/x`` or ``log(x)/(x - 1)``, printed as a Taylor
polynomial (:class:`TaylorPolynomial`, Horner's scheme) near the singular point and as the
closed form at a guarded argument elsewhere. The coefficients come from Cauchy's integral
formula in mpmath, and the switch point is the smallest at which the closed form is
accurate in float32.
"""

from __future__ import annotations

import ast
import contextvars
import hashlib
from typing import Callable

import mpmath
import sympy
from sympy.core.function import ArgumentIndexError

from ..codegen.syntax import Code, binop, number, parens
from .functions import (
    erfcx,
    expand_functions,
    ExpandedFunction,
    guard,
    hypot,
    hypot_excess,
    log_ndtr,
    logaddexp,
    ndtr,
    sigmoid,
    softplus,
    StableFunction,
    to_elementary,
    xlogy,
)


# -- removable singularities at 0 ---------------------------------------------------------

# A Symbol, not a Dummy: a Dummy's index depends on what ran before, and the class names
# (hashes of the closed form) must be the same in every process.

_T = sympy.Symbol("_symgrad_t", real=True)
_CAUCHY_POINTS = 128
_DEGREE_MAX = 36
_REL_TOL = 1e-17  # truncation error allowed, relative to the polynomial's size at eps
# Thresholds, smallest first: the smallest at which the closed form is accurate in
# float32 wins (the shortest polynomial); see _choose_eps.

_EPS_CANDIDATES = (0.125, 0.25, 0.5, 1.0, 2.0)
_FLOAT32_ULPS = 8  # closed-form error allowed at the threshold, in float32 ulps
_REMOVABLE_CACHE: dict[str, type] = {}
# How a Removable's derivative is rewritten before its own series is made. The rewrite
# engine (above this module) sets its stable_closed_form here while it runs, and each
# Removable made meanwhile keeps it: its derivative is printed away from the center like any
# derivative, so it takes the same rewrites. Unset, the derivative is used as written.

DERIVATIVE_FORM: contextvars.ContextVar[Callable[[sympy.Expr], sympy.Expr] | None] = contextvars.ContextVar(
    "derivative_form", default=None
)


class Removable(ExpandedFunction):
    """Base of the generated classes ``f(x)`` with a removable singularity at ``x = center``
    (0, or a dyadic number such as 1: ``log(x)/(x - 1)``).

    Each subclass holds ``closed`` (the expression in the dummy ``_T``), ``center``,
    ``coeffs`` (Taylor coefficients at ``center``, as floats, lowest degree first) and
    ``eps``: for ``|x - center| < eps`` the Taylor polynomial in ``x - center`` is used
    (exact to double precision there), elsewhere the closed form. (``x - center`` is exact
    near a dyadic center: Sterbenz's lemma.)
    """

    closed: sympy.Expr
    center: sympy.Rational = sympy.Integer(0)
    # The rewrite of the closed form's derivative (DERIVATIVE_FORM when the class was made).
    derivative_form: Callable[[sympy.Expr], sympy.Expr] | None = None
    coeffs: tuple[float, ...]
    eps: float

    @classmethod
    def eval(cls, x):
        if (x - cls.center).is_zero:
            return (
                sympy.Float(cls.coeffs[0]) if cls.coeffs[0] != int(cls.coeffs[0]) else sympy.Integer(int(cls.coeffs[0]))
            )

    @classmethod
    def _imp_(cls, x):
        x = mpmath.mpmathify(x)
        offset = x - mpmath.mpf(cls.center)
        if abs(offset) < mpmath.mpf(cls.eps) / 1000:
            # Near the center, the series (exact to well below double precision here).
            return _horner_mp(cls.exact_coeffs, offset)
        with mpmath.extradps(30):  # the closed form cancels near 0
            value = _lambdified(cls)(x)
        return +value

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        derivative = sympy.diff(type(self).closed, _T)
        # The closed form's derivative rewritten as every derivative is (derivative_form),
        # since it is printed away from 0: x/(1 - exp(-x))'s second derivative, the derivative
        # of -x/(4*sinh(x/2)**2) - 1/expm1(-x), had exp(-x)/expm1(-x)**2 in it, inf/inf = nan
        # from x = -89 in float32. (As written if that form has no series at 0.)
        center, form = type(self).center, type(self).derivative_form
        if form is None:
            made = removable(derivative, _T, center)
        else:
            token = DERIVATIVE_FORM.set(form)
            try:
                made = removable(form(derivative), _T, center) or removable(derivative, _T, center)
            finally:
                DERIVATIVE_FORM.reset(token)
        if made is None:  # cannot happen for an analytic function; keep it exact anyway
            raise ArgumentIndexError(self, argindex)
        return made(self.args[0])

    def elementary(self):
        return type(self).closed.xreplace({_T: self.args[0]})

    def _sympystr(self, printer) -> str:
        # Docstrings show the function itself; its value at 0 is the limit.
        return printer._print(self.elementary())

    @classmethod
    def expanded(cls, x: sympy.Expr) -> sympy.Expr:
        """The Taylor polynomial where ``|x| < eps``, the closed form elsewhere, each at a
        guarded argument.

        Both arguments are guarded, not only the closed form's: the polynomial's powers
        (up to ``x**36``) overflow for large ``|x|``, and the double backward then
        multiplied ``torch.where``'s zero by inf (NaN, for ``sin(x)/x`` at ``|x| = 300``
        in float32). The plan expands every Removable so that CSE computes the mask and
        the guarded arguments once.
        """
        offset = x - cls.center
        near = sympy.Abs(offset) < cls.eps
        series = cls.series_at(guard(offset, near, sympy.Float(0)))
        # (guarded as the last branch, where ``near`` does not hold: the mask computed once
        # serves both guards and the outer where. The closed form takes x itself, not
        # center + offset: x - 1 rounds to -1 for a tiny x, where log(x)/(x - 1) is exact.)
        safe = sympy.Float(cls.center + cls.eps)
        closed = cls.closed.xreplace({_T: guard(x, sympy.true, safe, near)})
        return sympy.Piecewise((series, near), (closed, True))

    @classmethod
    def series_at(cls, x: sympy.Expr) -> sympy.Expr:
        """The Taylor polynomial at ``x``, in ``x**2`` where the series is even or odd.

        An even series ``P(x**2)`` or an odd one ``x*P(x**2)`` is evaluated by Horner's
        scheme in ``x**2``: half the multiplications of Horner in ``x``, and no general
        power. (``c*x**n`` printed term by term ran torch's pow kernel once per term:
        ``sin(x)/x``'s forward and backward took 2.2x as long at 1e6 float32.)
        """
        even, odd = cls.coeffs[0::2], cls.coeffs[1::2]
        if not any(odd):
            return _taylor_class(cls.__name__ + "_even", even)(x**2)
        if not any(even):
            return x * _taylor_class(cls.__name__ + "_odd", odd)(x**2)
        return _taylor_class(cls.__name__ + "_series", cls.coeffs)(x)


_TAYLOR_CACHE: dict[tuple[str, tuple[float, ...]], type] = {}


def _taylor_class(name: str, coeffs: tuple[float, ...]) -> type:
    made = _TAYLOR_CACHE.get((name, coeffs))
    if made is None:
        made = type(name, (TaylorPolynomial,), {"coeffs": tuple(coeffs), "__module__": __name__})
        _TAYLOR_CACHE[name, coeffs] = made
    return made


class TaylorPolynomial(StableFunction):
    """Base of the generated classes ``c0 + c1*x + c2*x**2 + ...`` (a Removable's series).

    A function rather than a SymPy sum, so that SymPy neither pushes the powers into the
    guard's Piecewise nor reorders the terms: it prints as Horner's scheme, lowest degree
    outermost (:func:`_polynomial_code`).
    """

    nargs = 1
    coeffs: tuple[float, ...]

    @classmethod
    def _imp_(cls, x):
        return _horner_mp([mpmath.mpf(c) for c in cls.coeffs], mpmath.mpmathify(x))

    def elementary(self):
        x = self.args[0]
        return sympy.Add(*(sympy.Float(c) * x**n for n, c in enumerate(type(self).coeffs) if c))

    @classmethod
    def torch_code(cls, printer, args: list, values: tuple[sympy.Expr, ...] = ()) -> Code:
        (x,) = args
        return _polynomial_code(cls.coeffs, x.code)

    @classmethod
    def torch_code_is_atom(cls) -> bool:
        """Whether :meth:`torch_code` is a plain number (degree 0, a positive literal without
        an exponent): an operand without parentheses."""
        nonzero = [n for n, c in enumerate(cls.coeffs) if c]
        return nonzero == [0] and cls.coeffs[0] > 0 and "e" not in repr(cls.coeffs[0])

    @classmethod
    def torch_code_is_sum(cls) -> bool:
        """Whether :meth:`torch_code` is a sum at its top: Horner's scheme adds ``c0`` last,
        where ``c0`` is not zero and a higher coefficient is (:func:`_polynomial_code`)."""
        return bool(cls.coeffs) and cls.coeffs[0] != 0 and any(c for c in cls.coeffs[1:])


_LAMBDIFIED: dict[type, object] = {}


def _lambdified(cls):
    if cls not in _LAMBDIFIED:
        _LAMBDIFIED[cls] = sympy.lambdify(_T, cls.closed, modules="mpmath")
    return _LAMBDIFIED[cls]


def _horner_mp(coeffs, x):
    total = mpmath.mpf(0)
    for c in reversed(coeffs):
        total = total * x + c
    return total


def _polynomial_code(coeffs: tuple[float, ...], x: Code) -> Code:
    """``x * (x * (c3 * x + c2) + c1) + c0``, Horner's scheme over the coefficients: a
    multiply and an add a degree, which the in-place pass makes one chain on the innermost
    product's buffer, ``(c3 * x).add_(c2).mul_(x).add_(c1)...`` (a number written first,
    ``c2 + c3 * x``, would allocate again: a number minus a tensor has no in-place form)."""
    if not isinstance(x, ast.Name):
        x = parens(x)
    degree = max((n for n, c in enumerate(coeffs) if c), default=None)
    if degree is None:
        return binop(0.0, "*", x)
    code: Code = number(coeffs[degree])
    for n in range(degree - 1, -1, -1):
        code = binop(code, "*", x) if n == degree - 1 else binop(x, "*", parens(code))
        if coeffs[n] > 0:
            code = binop(code, "+", number(coeffs[n]))
        elif coeffs[n] < 0:
            code = binop(code, "-", number(-coeffs[n]))
    return code


_ANALYTIC = (
    sympy.exp,
    sympy.log,
    sympy.sin,
    sympy.cos,
    sympy.tan,
    sympy.sinh,
    sympy.cosh,
    sympy.tanh,
    sympy.atan,
    sympy.asinh,
    sympy.erf,
    sympy.erfc,
    sympy.asin,
    sympy.acos,
    sympy.atanh,
)


def _analytic_candidate(expr: sympy.Expr, x: sympy.Symbol, center: sympy.Rational = sympy.Integer(0)) -> bool:
    """Only expressions built from functions analytic near ``center`` (apart from poles)."""
    from sympy.codegen.cfunctions import expm1, log1p

    for node in sympy.preorder_traversal(expr):
        if node.is_Atom or node.is_Add or node.is_Mul:
            continue
        if node.is_Pow:
            if not node.exp.is_Integer and node.base.has(x) and not _positive_at(node.base, x, center):
                # (A root of a base that is positive at the center is analytic around it:
                # (sqrt(1 + x) - 1)/x's gradient was 0 in float32 at |x| = 1e-8, where it is
                # -1/8, and (1 + x)**(1/x) was 1 there, where it is e.)
                return False
            continue
        if isinstance(node, (softplus, sigmoid, ndtr, erfcx, log_ndtr, logaddexp, xlogy, expm1, log1p) + _ANALYTIC):
            continue
        if isinstance(node, Removable):
            continue
        if isinstance(node, (hypot, hypot_excess)) and any(a.is_number and a.is_nonzero for a in node.args):
            # sqrt(x**2 + b**2), b != 0: analytic near 0 (asinh(x)/x's gradient, (1/hypot(x, 1)
            # - asinh(x)/x)/x, was 0 in float32 below |x| = 1e-4, where it is -x/3)
            continue
        return False
    return True


def _positive_at(base: sympy.Expr, x: sympy.Symbol, center: sympy.Rational) -> bool:
    """Whether ``base``, in ``x`` only, is positive at ``x = center`` (numerically)."""
    if base.free_symbols != {x}:
        return False
    try:
        value = to_elementary(base).evalf(30, subs={x: center})
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        return False
    # (nan, zoo and oo are Numbers too, and SymPy raises on comparing nan: the base of
    # tanh(log(x))**c at 0 is nan, which stopped generation with a TypeError)
    return bool(value.is_Number and value.is_finite and value > 1e-20)


def removable(expr: sympy.Expr, x: sympy.Symbol, center: sympy.Rational = sympy.Integer(0)):
    """A :class:`Removable` ``f`` with ``f(x) == expr`` if ``expr`` (in ``x`` only) has a
    removable singularity at ``x = center`` and is analytic around it; else ``None``."""
    closed = expr.xreplace({x: _T}) if x != _T else expr
    key = sympy.srepr(closed) if center == 0 else f"{sympy.srepr(closed)} at {center}"
    if key in _REMOVABLE_CACHE:
        return _REMOVABLE_CACHE[key]
    made = _make_removable(closed, key, sympy.Rational(center))
    _REMOVABLE_CACHE[key] = made
    return made


def _make_removable(closed: sympy.Expr, key: str, center: sympy.Rational):
    if closed.free_symbols != {_T} or not _analytic_candidate(closed, _T, center):
        return None
    try:
        unshifted = sympy.lambdify(_T, to_elementary(closed), modules="mpmath")
    except Exception:  # pragma: no cover - an unprintable expression is simply left alone
        return None
    if center == 0:
        f = unshifted
    else:
        # f in the offset from the center: its singularity at 0, where the search looks
        shift = mpmath.mpf(center.p) / center.q  # (dyadic: exact)

        def f(offset):
            return unshifted(offset + shift)

    with mpmath.workdps(50):
        if not _bounded_and_continuous_at_zero(f):
            return None
        for radius in (mpmath.mpf(8), mpmath.mpf(4), mpmath.mpf(2), mpmath.mpf(1), mpmath.mpf("0.5")):
            coeffs = _cauchy_coefficients(f, radius)
            if coeffs is None:
                continue
            negatives, series = coeffs
            scale = max(abs(c) * radius**n for n, c in enumerate(series))
            if scale == 0 or any(abs(c) > mpmath.mpf(10) ** -30 * scale for c in negatives):
                continue  # a pole, a branch point or a non-analytic function
            chosen = _choose_eps(series, f, radius)
            if chosen is None:
                continue
            eps, degree = chosen
            exact = [mpmath.mpf(c.real) for c in series[: degree + 1]]
            # Verify against direct evaluation at real points inside the Taylor disk.
            ok = True
            for point in (eps * 0.7, -eps * 0.7, eps * 0.31, -eps * 0.93):
                p = mpmath.mpf(point)
                try:
                    direct = mpmath.re(f(p))
                except (ZeroDivisionError, ValueError):
                    ok = False
                    break
                approx = _horner_mp(exact, p)
                if abs(direct - approx) > mpmath.mpf(10) ** -16 * (abs(direct) + scale * 1e-3):
                    ok = False
                    break
            if not ok:
                continue
            floats = tuple(0.0 if abs(c) < mpmath.mpf(10) ** -30 * scale else float(c) for c in exact)
            name = "removable_" + hashlib.sha256(key.encode()).hexdigest()[:8]
            return type(
                name,
                (Removable,),
                {
                    "closed": closed,
                    "center": center,
                    "coeffs": floats,
                    "exact_coeffs": tuple(exact),
                    "eps": eps,
                    "derivative_form": DERIVATIVE_FORM.get(),
                    "__module__": __name__,
                },
            )
    return None


def _bounded_and_continuous_at_zero(f) -> bool:
    """A cheap screen before the Cauchy integrals: near 0 the values must agree, as they
    do for a removable singularity and do not for a pole or an essential singularity."""
    try:
        # Complex points too: exp(-1/x**2) is flat on the real line but not removable.
        points = [mpmath.mpf("1e-12"), mpmath.mpf("-1e-12"), mpmath.mpc(0, "3e-12"), mpmath.mpf("0.3")]
        values = [mpmath.mpmathify(f(h)) for h in points]
    except (ZeroDivisionError, ValueError, OverflowError, TypeError, MemoryError):
        # MemoryError: mpmath building exp of an astronomically large exponent, as in
        # expm1(expm1(acos(x)/x)) near 0
        return False
    if not all(mpmath.isfinite(v) for v in values):
        return False
    near, scale = values[:3], 1 + abs(values[3])
    return all(abs(a - near[0]) <= mpmath.mpf(10) ** -6 * scale for a in near) and abs(near[0]) < 1e6 * scale


def _cauchy_coefficients(f, radius):
    """Laurent coefficients of ``f`` on a circle: (c_-1..c_-4, [c_0, c_1, ...])."""
    m = _CAUCHY_POINTS
    roots = [mpmath.expjpi(mpmath.mpf(2 * k) / m) for k in range(m)]
    values = []
    for k in range(m):
        try:
            v = mpmath.mpmathify(f(radius * roots[k]))
        except (ZeroDivisionError, ValueError, OverflowError, TypeError):
            return None
        if not mpmath.isfinite(v):
            return None
        values.append(v)

    def coefficient(n: int):
        return mpmath.fsum(values[k] * roots[(-k * n) % m] for k in range(m)) / m

    series = [coefficient(n) / radius**n for n in range(_DEGREE_MAX + 3)]
    negatives = [coefficient(-n) * radius**n for n in range(1, 5)]
    if any(abs(c.imag) > mpmath.mpf(10) ** -25 * (abs(c.real) + 1) for c in series[:_DEGREE_MAX]):
        return None  # a real function has real Taylor coefficients
    return negatives, series


def _choose_eps(series, f, radius):
    """The threshold and polynomial degree.

    Candidates are those for which a Taylor polynomial of degree <= _DEGREE_MAX is exact
    to about ``_REL_TOL`` (and that lie well inside the Cauchy circle). The closed form
    cancels near 0 (``(x*cos(x) - sin(x))/x**2``), so the smallest candidate at which it
    is accurate in float32 (24-bit arithmetic in mpmath, a stand-in for torch's) wins;
    failing that, the largest candidate.
    """
    feasible = []
    for eps in _EPS_CANDIDATES:
        if eps > radius / 2:
            break
        e = mpmath.mpf(eps)
        sizes = [abs(c) * e**n for n, c in enumerate(series)]
        scale = max(sizes[:_DEGREE_MAX])
        for degree in range(_DEGREE_MAX + 1):
            if all(s <= _REL_TOL * scale for s in sizes[degree + 1 :]):
                feasible.append((eps, degree))
                break
    for eps, degree in feasible:
        if _float32_error(f, eps) <= _FLOAT32_ULPS * 2.0**-24:
            return eps, degree
    return feasible[-1] if feasible else None


def _float32_error(f, eps: float) -> float:
    """Largest relative error of ``f`` evaluated in 24-bit arithmetic on [eps, 3*eps]."""
    worst = 0.0
    for factor in ("1", "1.07", "1.3", "1.6", "2.1", "3"):
        with mpmath.workprec(24):
            x = +mpmath.mpf(eps) * mpmath.mpf(factor)  # a float32 number
        try:
            with mpmath.workprec(24):
                got = mpmath.mpmathify(f(x))
            with mpmath.workdps(50):
                want = mpmath.mpmathify(f(x))
        except (ZeroDivisionError, ValueError, OverflowError):
            return float("inf")
        if want != 0:
            worst = max(worst, float(abs(mpmath.re(got) - mpmath.re(want)) / abs(want)))
    return worst


def _as_printed(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ExpandedFunction as the Piecewise the code computes, and each
    Taylor series as its polynomial."""
    return expand_functions(expr).replace(lambda node: isinstance(node, TaylorPolynomial), lambda node: node.elementary())
