"""Second derivatives: whether autograd's derivative of a printed first-order formula loses
accuracy (:func:`autograd_loses_second_derivatives`), and the exact second derivatives that
double backward then uses (:func:`exact_second_derivatives`).
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy
from sympy.codegen.cfunctions import expm1

from ..errors import SymgradError
from ..math.accuracy import finite_where_the_math_is
from ..math.functions import hypot, hypot_plus, sigmoid, softplus
from ..math.series import _as_printed
from ..math.simplify import cheapest_form, op_count, SIMPLIFY_MAX_OPS
from ..rewrite.cost import CPU_COSTS, CostModel, _sech_as_sigmoid_pairs, cheaper_forms
from ..rewrite.engine import stabilize
from ..rewrite.sums import has_difference_of_squares, has_offset_quotient
from .differentiate import _differentiate


def differentiable_form(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each 1/cosh(u)**(2k) as (4*sigmoid(2u)*sigmoid(-2u))**k: for a formula
    that only double backward runs, which autograd differentiates.

    autograd's derivative of cosh(u)**-2 is -2*sinh(u)*cosh(u)**-3, inf*0 = nan from |u| = 90
    in float32; the sigmoids' derivatives are finite.
    First-order gradients keep the cosh where it is cheaper
    (cheaper_eager_form): its value is right where cosh overflows (inf**-2 = 0).
    """
    return _sech_as_sigmoid_pairs(expr)


class _autograd_sigmoid(sigmoid):  # noqa: N801 (SymPy's naming)
    """sigmoid, differentiated as autograd differentiates torch.sigmoid: y*(1 - y), which is
    0 in float32 from u = 17, where the exact sigmoid(u)*sigmoid(-u) is 4e-8."""

    def fdiff(self, argindex=1):
        return self * (1 - self)


class _autograd_expm1(expm1):  # noqa: N801 (SymPy's naming)
    """expm1, differentiated as autograd differentiates torch.expm1: y + 1 (derivatives.yaml),
    which is 0 in float32 from u = -17, where the exact exp(u) is 4e-8 (the VAE's KL term
    (mu**2 + exp(lv) - 1 - lv)/2, whose gradient is expm1(lv)/2)."""

    def fdiff(self, argindex=1):
        return self + 1


class _autograd_power(sympy.Function):  # noqa: N801 (SymPy's naming)
    """base**exponent, differentiated as autograd differentiates torch's pow and sqrt: into
    a factor of its own, exponent*base**(exponent - 1), times the rest of the chain.

    SymPy joins powers of one base, so its derivative of sqrt(1 - s) times s's (1 - s) is
    sqrt(1 - s), finite; autograd computes (1 - s) / (2*sqrt(1 - s)), 0/0 = nan where 1 - s
    has rounded to 0 (atan(exp(x**x))'s gradient reuses sqrt(1 - sigmoid(2*x**x)), and its
    double backward was nan from x = 2.9 in float64).
    """

    nargs = 2

    def fdiff(self, argindex=1):
        base, exponent = self.args
        if argindex == 1:
            return exponent * _autograd_power(base, exponent - 1)
        return self * sympy.log(base)

    def _eval_evalf(self, prec):
        # (A param fixed at its value makes a number of it, which Max and Min compare.)
        return sympy.Pow(*self.args)._eval_evalf(prec)

    def _mpmathcode(self, printer):
        # The probes' guarded power (probe._ProbePrinter), one factor still.
        return f"_probe_power({printer._print(self.args[0])}, {printer._print(self.args[1])})"


def _powers_as_factors(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with each power of a variable base as an _autograd_power, but inside
    conditions, which are never differentiated."""
    if expr.is_Atom or isinstance(expr, sympy.logic.boolalg.Boolean) or not expr.free_symbols:
        return expr
    args = tuple(_powers_as_factors(a) for a in expr.args)
    if expr.is_Pow and expr.base.free_symbols:
        return _autograd_power(*args)
    return expr.func(*args) if args != expr.args else expr


def _as_autograd_differentiates(formula: sympy.Expr) -> sympy.Expr:
    """``formula`` as printed, with torch.sigmoid (by its output) and powers (a factor of
    their own) differentiating as autograd differentiates them: for _autograd_derivative."""
    printed = _as_printed(formula).replace(sigmoid, _autograd_sigmoid).replace(expm1, _autograd_expm1)
    return _powers_as_factors(printed)


def _autograd_derivative(printed: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr | None:
    """The derivative by ``symbol`` of a formula as autograd computes it from the printed
    code (``printed``: its _as_autograd_differentiates form), operation by operation and
    unsimplified; None where SymPy cannot write it."""
    try:
        derivative = _differentiate(printed, symbol)
    except SymgradError:
        return None
    return derivative.replace(_autograd_sigmoid, sigmoid).replace(_autograd_expm1, expm1)


# Outer functions whose derivative underflows where an exponential inside overflows.

_NESTED_OUTER = (sympy.exp, sympy.tanh, sigmoid, softplus)


def autograd_loses_second_derivatives(
    formula: sympy.Expr, raw: sympy.Expr, symbols: tuple[sympy.Symbol, ...], fixed: Mapping[sympy.Symbol, sympy.Expr] | None = None
) -> bool:
    """Whether autograd's derivative of ``formula`` (a create_graph formula of a gradient,
    whose unstabilised form is ``raw``) by some of ``symbols`` is nan or inaccurate where
    the mathematics is finite (finite_where_the_math_is), with the symbols in ``fixed``
    (params) probed at their values there only.

    autograd differentiates what backward computed, and that can lose what the first
    derivative kept: softplus's formula sigmoid(x) has autograd's derivative y*(1 - y), 0 at
    x = 20 in float32 where the exact value is 2.1e-9 (torch's own F.softplus gives 0 too),
    and 1/expm1(x), log(1 - exp(-x))'s, has exp(x)/expm1(x)**2, inf/inf = nan at x = 100
   . Where SymPy cannot write autograd's derivative,
    False: it stays autograd's; and so it does, unchecked, beyond the simplification bounds
    (_beyond_second_derivative_bounds) and with four symbols or more. True without probing
    for three kinds of formula whose failure the probes cannot see: a function of an
    exponential, a hypot_plus and a difference of squares (below).
    """
    fixed = fixed or {}
    if _beyond_second_derivative_bounds(raw) or len((formula.free_symbols | raw.free_symbols) - set(fixed)) > 3:
        return False  # (four symbols: finite_where_the_math_is does not probe them)
    if any(isinstance(node, _NESTED_OUTER) and node.args[0].has(sympy.exp) for node in sympy.preorder_traversal(formula)):
        # A function of an exponential (TanhExp's tanh(exp(x)), exp(x - 2*exp(x)) in its
        # gradient): autograd's chain rule multiplies the inner exp, inf from x = 89 in
        # float32, by the outer's derivative, 0 there: nan, where the probes' exact reference
        # overflows too and so cannot show it.
        return True
    if formula.has(hypot_plus):
        # autograd's product rule on a quotient of it cancels between points the probe
        # samples: the x-gradient of y*(sqrt(x**2 + 1) - x), -y*r/h with r = hypot_plus(-x,
        # 1), has x-derivative y*(r/h**2 + x*r/h**3), 5e-4 off at x = -50 in float32, while
        # its symbolic form y*r*hypot_plus(x, 1)/h**3 (roots._hypot_sum) is exact.
        return True
    if _has_nested_hypot(_as_printed(formula)):
        # hypot(hypot(x, y), c): autograd's chain rule multiplies the inner hypot's
        # derivative x/hypot(x, y), 0/0 = nan at x = y = 0, by hypot(x, y)/H, and SymPy's
        # derivative cancels the two, so the probe cannot see it: the Hessian of
        # x/sqrt(x**2 + y**2 + 1e-8) was nan at the origin.
        return True
    if has_difference_of_squares(formula) or has_offset_quotient(formula):
        # (1 - x)*(1 + x) (sums._difference_of_squares): autograd's product rule computes
        # its derivative as (1 - x) - (1 + x), which cancels near 0, where the probes' points
        # do not reach: asin's second derivative was 0 at x = 1e-8 in float32;
        # and x/(1 + x)'s quotient rule cancels at large x, beyond their reach
        return True
    # (fixed first: a param is never differentiated, and as a number it folds)
    printed = _as_autograd_differentiates(formula.xreplace(fixed))
    for symbol in symbols:
        autograd = _autograd_derivative(printed, symbol)
        if autograd is None:
            return False
        if not finite_where_the_math_is(autograd, _differentiate(raw, symbol).xreplace(fixed)):
            return True
    return False


def _has_nested_hypot(expr: sympy.Expr) -> bool:
    """Whether some hypot in ``expr`` has a hypot among its arguments."""
    return any(
        isinstance(node, hypot) and any(isinstance(arg, hypot) for arg in node.args)
        for node in sympy.preorder_traversal(expr)
    )


def exact_second_derivatives(
    raw: sympy.Expr,
    gradient: sympy.Expr,
    symbols: tuple[sympy.Symbol, ...],
    identities: set[str],
    fixed: Mapping[sympy.Symbol, sympy.Expr] | None = None,
    costs: CostModel = CPU_COSTS,
) -> tuple[sympy.Expr, ...] | None:
    """The derivatives of ``gradient`` (whose unstabilised form is ``raw``) by each of
    ``symbols``, each the cheapest symbolic form that finite_where_the_math_is accepts (with
    the symbols in ``fixed`` at their values there), for double backward to use where
    autograd's would be wrong (autograd_loses_second_derivatives); None where some
    derivative has no such form, or beyond the same bounds. Adds the identities used to
    ``identities``; ``costs`` chooses the cheaper forms.
    """
    fixed = fixed or {}
    if _beyond_second_derivative_bounds(raw):
        return None
    row, used_by_row = [], set()
    for symbol in symbols:
        exact = _differentiate(raw, symbol)
        # The derivative of the stable gradient first: symgrad's functions differentiate into
        # stable forms (sigmoid's into sigmoid(u)*sigmoid(-u)), and it costs no simplify (a
        # second each for two symbols). Then the simplified exact derivative.
        candidates = (lambda: _differentiate(gradient, symbol), lambda: cheapest_form(exact))
        if has_difference_of_squares(gradient) or has_offset_quotient(gradient):
            # (The product rule on (1 - x)*(1 + x) is as symbolic as autograd's: atanh's
            # 1/((1 - x)*(1 + x)) differentiates into 1/(1 - x) - 1/(1 + x) over it, which
            # cancels near 0, beyond the probes' reach; simplified, 2*x/(1 - x**2)**2 does not.
            # Likewise -x/(1 + x)'s -1/(1 + x) + x/(1 + x)**2 at large x, and -1/(1 + x)**2.)
            candidates = candidates[::-1]
        forms = []
        for differentiate in candidates:
            used: set[str] = set()
            (candidate,) = cheaper_forms((stabilize(differentiate()),), used, False, costs)
            forms.append((candidate, used))
        # The first form right at every probe, far ones included; else the first right near
        # the domain: the far points decide that autograd's form fails, and a replacement
        # exact near the domain but overflowing far out (-2*x/(1 + x**2)**2 from |x| = 1e10
        # in float32) still beats autograd's cancelling one there.
        chosen = next(
            (
                (candidate, used)
                for far in (True, False)
                for candidate, used in forms
                if finite_where_the_math_is(candidate.xreplace(fixed), exact.xreplace(fixed), far=far)
            ),
            None,
        )
        if chosen is None:
            return None
        candidate, used = chosen
        used_by_row |= used
        row.append(candidate)
    identities |= used_by_row
    return tuple(row)


def _beyond_second_derivative_bounds(raw: sympy.Expr) -> bool:
    """Whether ``raw`` is beyond the simplification bounds, where double backward keeps
    autograd's derivative unchecked: the probes' mpmath polygamma took 2 minutes over
    acosh(logaddexp(x, digamma(logaddexp(z, x)))), which generated in 4 s without them.
    """
    return op_count(raw) > SIMPLIFY_MAX_OPS or raw.has(sympy.gamma, sympy.loggamma, sympy.polygamma)


def _second_derivatives(
    raw: sympy.Expr,
    gradient: sympy.Expr,
    inputs: tuple[sympy.Symbol, ...],
    fuse: bool,
    identities: set[str],
    costs: CostModel = CPU_COSTS,
) -> tuple[sympy.Expr, ...]:
    """The derivatives of ``gradient`` (whose unstabilised form is ``raw``) by each input, as
    double backward computes them, adding the identities used to ``identities``.

    First the simplified derivative of ``raw``, which is usually shortest; if
    finite_where_the_math_is refuses it, the derivative of the stable form forward computes,
    where SymPy's simplification had made it unstable again: SiLU's became sinh(x/2) times
    powers of 1.5 of sigmoids, inf*0 from x = 179 in float32.
    If both fail, the first stays, as before the check: often the user's expression
    overflows there whatever the form (x**y*sigmoid(-x**y) at x = 1e-3, y = -20 in float32,
    inf*0), and not returning the derivative would cost its
    speed for nothing. (Not always: the two-input softmax exp(a)/(exp(a) + exp(b) + 1) keeps
    rows that are nan at large |a|, |b| in float32, where autograd's derivative of the
    recomputed gradient is finite; README, "Numerical stability".)
    """
    exact = [_differentiate(raw, s) for s in inputs]
    first = None
    for differentiate in (
        lambda s, e: cheapest_form(e),
        lambda s, e: _differentiate(gradient, s),
    ):
        used: set[str] = set()
        row = tuple(stabilize(differentiate(s, e)) for s, e in zip(inputs, exact))
        row = cheaper_forms(row, used, fuse, costs)
        if all(finite_where_the_math_is(g, e) for g, e in zip(row, exact)):
            break
        first = first or (row, used)
    else:
        row, used = first
    identities |= used
    return row
