"""The rewrite engine: :func:`stabilize` rewrites an expression into an equal form that is
finite and accurate on more inputs, with the rules of :data:`symgrad.rewrite.rules.RULES`
applied bottom-up until nothing changes, then the passes that the rules would undo, the
removable singularities and the Piecewise guards. The rules themselves are in the family
modules of this package; :mod:`symgrad.rewrite` describes them in order.
"""

from __future__ import annotations

import sympy

from ..math.series import DERIVATIVE_FORM
from .exp_log import (
    _cosh_power_sums,
    _expm1_partners,
    _rule_acosh_near_one,
    _rule_coth_half,
    _rule_exp_difference_ratio,
    _rule_exp_lse,
    _rule_exp_over_expm1,
    _rule_exp_over_positive_expm1,
    _rule_factor_exp_sum,
    _rule_inverse,
    _rule_log,
    _rule_log_product,
    _rule_merge_exp,
    _rule_minus_one,
    _rule_ratio,
    _rule_same_base,
    _rule_sigmoid_difference,
    _rule_sinh_over_cosh,
    _rule_softmax,
    _rule_tanh_half,
    _sigmoid_exp_products,
)
from .patterns import _MAX_PASSES, _replace_each, _ROOT_SUMS
from .piecewise import _guard_piecewise, _rule_heaviside_mask
from .removable import _removable_singularities
from .roots import (
    _hypot_sums,
    _rule_abs_of_power,
    _rule_hypot,
    _rule_hypot_excess,
    _rule_norm_ratio,
    _rule_power_minus_value,
    _rule_root_excess,
    _rule_sign_abs_power,
)
from .sums import _difference_of_squares, _rule_add, _rule_large_part, _rule_xlogy, _rule_xlogy_absorbs
from .tails import _normal_tail_products, _rule_normal_tail


def stabilize(expr: sympy.Expr, *, root_sums: bool = False) -> sympy.Expr:
    """Rewrite ``expr`` into an equal form that is finite and accurate on more inputs.

    ``root_sums``: write a power minus its value with a fractional or negative exponent as
    sums of roots or reciprocals (_root_power_difference), which need no where, for a
    formula that is only evaluated, such as the forward's. A derivative formula keeps
    power_excess: autograd's derivative of the sums (double backward), through the roots,
    cancels where a root nears 0 (``(1 + x)**2.5/2.5 - x``'s second derivative was 950
    float32 ulps off at x = -0.9999999 and nan at -1) and lost 4.7e7 ulps at large x
    (``x*((1 + x**2)**-0.25 - 1)``'s at 1e10); power_excess's is exact (found in review).
    """
    token = _ROOT_SUMS.set(root_sums)
    form = DERIVATIVE_FORM.set(stable_closed_form)  # for the Removables made here
    try:
        expr = stable_closed_form(expr)
        expr = _removable_singularities(expr)
        expr = _guard_piecewise(expr)
    finally:
        DERIVATIVE_FORM.reset(form)
        _ROOT_SUMS.reset(token)
    return expr


def stable_closed_form(expr: sympy.Expr) -> sympy.Expr:
    """:func:`stabilize`'s rewrites (1. in the module docstring) without its removable
    singularities and Piecewise guards: for a Removable's derivative, whose closed form is
    printed away from 0 (stable_functions.Removable.fdiff)."""
    form = DERIVATIVE_FORM.set(stable_closed_form)  # for the Removables its rules make
    try:
        return _stable_closed_form(expr)
    finally:
        DERIVATIVE_FORM.reset(form)


def _stable_closed_form(expr: sympy.Expr) -> sympy.Expr:
    rewriter = _Rewriter()
    expr = rewriter.rewrite(expr)
    if expr.is_Add:
        factored = rewriter.rewrite(sympy.factor_terms(expr))
        if sympy.count_ops(factored) < sympy.count_ops(expr):
            expr = factored
    expr = _normal_tail_products(expr)
    summed = _hypot_sums(expr)
    if summed != expr:
        # (the rules again, once: hypot_plus(u, b) - hypot(u, b) leaves u*b/h**3, whose
        # power of the norm _rule_norm_ratio shares out)
        expr = rewriter.rewrite(summed)
    spread = _cosh_power_sums(expr)
    if spread != expr:
        # (the rules again, once: sinh(u)*cosh(u)**-3 is then tanh(u)/cosh(u)**2; before the
        # passes below, whose results the rules would undo; found in review)
        expr = rewriter.rewrite(spread)
    expr = _sigmoid_exp_products(expr)
    expr = _expm1_partners(expr)
    return _replace_each(expr, sympy.Add, _difference_of_squares)


# -- the bottom-up rule engine ----------------------------------------------------------

class _Rewriter:
    def __init__(self) -> None:
        self.memo: dict[sympy.Basic, sympy.Basic] = {}

    def rewrite(self, expr: sympy.Basic, depth: int = 0) -> sympy.Basic:
        if expr.is_Atom or isinstance(expr, sympy.logic.boolalg.Boolean) or not isinstance(expr, sympy.Basic):
            return expr
        if expr in self.memo:
            return self.memo[expr]
        args = tuple(self.rewrite(a, depth) for a in expr.args)
        node = expr.func(*args) if args != expr.args else expr
        for _ in range(_MAX_PASSES):
            if node.is_Atom:
                break
            for rule in _RULES:
                try:
                    new = rule(node)
                except (TypeError, ValueError, ArithmeticError, sympy.PolynomialError):
                    # A rule that cannot decide on an unusual node (a zoo exponent, a
                    # non-polynomial bound) leaves it as it is: rewrites are optional.
                    new = None
                if new is not None and new != node:
                    node = self.rewrite(new, depth + 1) if depth < 8 else new
                    break
            else:
                break
        self.memo[expr] = node
        return node


_RULES = (
    _rule_acosh_near_one,
    _rule_inverse,
    _rule_minus_one,
    _rule_log,
    _rule_normal_tail,
    _rule_log_product,
    _rule_add,
    _rule_large_part,
    _rule_factor_exp_sum,
    _rule_ratio,
    _rule_softmax,
    _rule_merge_exp,
    _rule_exp_lse,
    _rule_hypot,
    _rule_hypot_excess,
    _rule_norm_ratio,
    _rule_heaviside_mask,
    _rule_root_excess,
    _rule_xlogy,
    _rule_xlogy_absorbs,
    _rule_same_base,
    _rule_tanh_half,
    _rule_coth_half,
    _rule_exp_over_expm1,
    _rule_exp_over_positive_expm1,
    _rule_exp_difference_ratio,
    _rule_sinh_over_cosh,
    _rule_abs_of_power,
    _rule_sign_abs_power,
    _rule_sigmoid_difference,
    _rule_power_minus_value,
)
