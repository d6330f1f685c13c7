"""The rewrite engine: :func:`stabilize` rewrites an expression into an equal form that is
finite and accurate on more inputs, with the rules of :data:`RULES`
applied bottom-up until nothing changes, then the passes that the rules would undo, the
removable singularities and the Piecewise guards. The rules themselves are in the family
modules of this package; :mod:`symgrad.rewrite` describes them in order.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import sympy

from ..math.series import DERIVATIVE_FORM
from .exp_log import (
    _cosh_power_sums,
    _expm1_partners,
    _rule_acosh_near_one,
    _rule_coth_half,
    _rule_exp_cosh,
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
    _rule_sinh_cosh_sum,
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
    _overflowing_powers,
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
    (``x*((1 + x**2)**-0.25 - 1)``'s at 1e10); power_excess's is exact.
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
    """:func:`stabilize`'s rewrites (1. in :mod:`symgrad.rewrite`) without its removable
    singularities and Piecewise guards: for a Removable's derivative, whose closed form is
    printed away from 0 (symgrad.math.series.Removable.fdiff)."""
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
        # passes below, whose results the rules would undo)
        expr = rewriter.rewrite(spread)
    expr = _sigmoid_exp_products(expr)
    expr = _expm1_partners(expr)
    expr = _replace_each(expr, sympy.Add, _difference_of_squares)
    return _overflowing_powers(expr)


# -- the bottom-up rule engine ----------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rewrite rule: ``apply(node)`` returns a node equal to ``node`` that is finite and
    accurate on more inputs, or None where the rule does not match. Its docstring states
    the identity; ``place`` says why the rule sits where it does in :data:`RULES`."""

    apply: Callable[[sympy.Expr], sympy.Expr | None]
    place: str

    @property
    def name(self) -> str:
        return self.apply.__name__.removeprefix("_rule_")

    @property
    def identity(self) -> str:
        """The rule's docstring: the identity it applies, and why."""
        return inspect.getdoc(self.apply) or ""


# The rules, in the order the engine tries them on each node. A node's arguments are
# rewritten first, and every result is rewritten again from the first rule, so a rule never
# waits for another's output: the order matters only where two rules match one node, and
# then the earlier one's form is kept. Each line says what the rule matches and, where its
# kind of node has other rules, why it goes before or after them.
RULES = (
    Rule(_rule_acosh_near_one, "acosh nodes: no other rule matches them"),
    Rule(_rule_inverse, "atanh and asinh nodes: no other rule matches them"),
    Rule(_rule_minus_one, "sums: c*exp(u) + k as expm1 first, the plainest cancellation of a sum with a number"),
    Rule(_rule_log, "logs: the forms of a whole log (log1p, softplus, logaddexp, log_sinh) before any split"),
    Rule(_rule_normal_tail, "logs of a scaled ndtr/erfc/erf: before log_product, which would split the scale off"),
    Rule(_rule_log_product, "logs: the generic split of a product, last, after the specific forms above"),
    Rule(_rule_add, "sums of a number and a bounded function (tanh, erf, sigmoid, softplus, sigmoid pairs)"),
    Rule(_rule_large_part, "sums where a softplus or sigmoid large part cancels: after add, the plainer cancellations"),
    Rule(_rule_factor_exp_sum, "negative powers of an exp sum: before ratio, so that it sees the sum's factors"),
    Rule(_rule_ratio, "products and powers: ratios of exponentials as sigmoids, the commonest product form"),
    Rule(_rule_softmax, "products and powers: three or more exponentials over their sum, which ratio leaves"),
    Rule(_rule_merge_exp, "products of exps: after ratio and softmax, which need the exponentials apart"),
    Rule(_rule_exp_cosh, "products of an exp and a cosh power: after merge_exp, which leaves one exp"),
    Rule(_rule_exp_lse, "exp nodes: exp(c + k*logsumexp(...)); no other rule matches an exp"),
    Rule(_rule_hypot, "non-integer powers of a sum of squares as hypot"),
    Rule(_rule_hypot_excess, "sums: hypot(a, b) - b; before power_minus_value, which would also match it"),
    Rule(_rule_norm_ratio, "products with a power of a hypot"),
    Rule(_rule_heaviside_mask, "products with a Heaviside factor"),
    Rule(_rule_root_excess, "sums: sqrt(A) - c; before power_minus_value, which would also match it"),
    Rule(_rule_xlogy, "products with a power of a log"),
    Rule(_rule_xlogy_absorbs, "products of a sum holding xlogy and a power of its base"),
    Rule(_rule_same_base, "products with a base and its power, b**e/b"),
    Rule(_rule_tanh_half, "products: expm1(u) times a power of sigmoid(-u)"),
    Rule(_rule_coth_half, "products: powers of (1 + exp(v)) over expm1(v), or of sigmoid(u) over sigmoid(-u)"),
    Rule(_rule_exp_over_expm1, "products: exp(u) over a power of expm1(u), the same u"),
    Rule(_rule_exp_over_positive_expm1, "products: exp(a) over expm1(u), u positive: after exp_over_expm1 (a = u)"),
    Rule(_rule_exp_difference_ratio, "products: exps over a difference of exps"),
    Rule(_rule_sinh_over_cosh, "products: powers of sinh over powers of cosh"),
    Rule(_rule_sinh_cosh_sum, "sums of r*sinh(u) and +-r*cosh(u): no other rule matches the pair"),
    Rule(_rule_abs_of_power, "Abs nodes: no other rule matches them"),
    Rule(_rule_sign_abs_power, "products: a power of b times a fractional power of Abs(b)"),
    Rule(_rule_sigmoid_difference, "sums of two sigmoids: after add, which takes sigmoid(u) + sigmoid(-u) to 1"),
    Rule(_rule_power_minus_value, "sums: any power minus its value, last: the widest pattern, after the specific ones"),
)


class _Rewriter:
    """Applies :data:`RULES` bottom-up, on every node until nothing changes."""

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
            for rule in RULES:
                try:
                    new = rule.apply(node)
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
