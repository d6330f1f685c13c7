"""Numerically stable rewrites, applied to forward expressions and derivatives alike.

A rewrite applied only to the forward comes back in the derivative (d/dx log1p(u) is
u'/(1+u) again), so :func:`stabilize` runs after differentiation and simplification too,
and its rules also match the forms ``simplify`` produces (``x*exp(x)/(exp(x) + 1)``,
``(x + exp(x) + 1)/(4*cosh(x/2)**2)``).

Every rule is an exact identity on the real numbers wherever the original expression is
defined (tests check this at random points with mpmath); the new forms are finite and
accurate in float32/float64 wherever the mathematics is. The rules, in order:

1. Bottom-up, on every node until nothing changes (our own rules, in place of
   ``sympy.codegen.rewriting``, whose ``log1p_opt``/``expm1_opt`` factor the whole
   expression: tens of seconds on a 40-term one):

   - ``log(1 + u)`` -> ``log1p(u)``; ``c*exp(u) - c`` -> ``c*expm1(u)`` (as SymPy's
     ``expm1_opt``: while the number term shrinks); ``c - c*cos(u)`` -> ``2c*sin(u/2)**2``.
   - ``log(c*exp(v)*(1+exp(w)))`` -> ``log(c) + v + softplus(w)``; ``log(exp(a)+exp(b))``
     -> ``logaddexp(a, b)`` (three or more: nested); ``log1p(exp(u))`` -> ``softplus(u)``;
     ``log(sigmoid(u))`` -> ``-softplus(-u)``; ``log(c*sinh(u))`` -> ``log(|c|) +
     log_sinh(+-u)`` (sinh overflows), and out of a ratio or a power (_log_sinh_ratio:
     ``log(x/sinh(x))``); ``log(c*tanh(u))`` -> ``log(|c|) - log1p(2/expm1(+-2u))``;
     ``log(p*exp(a) - p*exp(b))`` -> ``log(p) + a + log1mexp(b - a)``, and its derivatives'
     ratios ``exp(c)*(p*exp(a) - p*exp(b))**-k`` likewise (_rule_exp_difference_ratio).
   - sums: ``c - c*tanh(u)**2`` -> ``c/cosh(u)**2``, and ``c + k*tanh(u)**2`` with ``c + k``
     small next to ``k`` -> ``(c + k) - k/cosh(u)**2``; ``c + c*tanh(u)`` -> ``2c*sigmoid(2u)``;
     ``c + c*erf(u)`` -> ``2c*ndtr(sqrt(2)*u)`` (SymPy turns ``erfc(-u)`` back into
     ``2 - erfc(u)``, which cancels); ``c - c*sigmoid(u)`` -> ``c*sigmoid(-u)``;
     ``u - softplus(u)`` -> ``-softplus(-u)``; ``sigmoid(u) + sigmoid(-u)`` -> ``1``,
     ``sigmoid(u) - sigmoid(-u)`` -> ``tanh(u/2)``; ``c/tanh(u) - c`` -> ``2c/expm1(2u)``;
     ``v + softplus(-2v) - log(2)`` ->
     ``log(cosh(v))``; (a Float equal to a rational counts as it);
     ``c*sigmoid(a) - c*sigmoid(b)``, a number apart, -> a product (_rule_sigmoid_difference);
     a power minus its value at 0, ``A**p - B**p`` -> ``(A - B)*S`` for an integer p from 1
     to 8, ``S`` the sum of ``A**j*B**(p-1-j)``, ``-(A - B)/(A*B)`` for p = -1 (``c/(a + v) -
     c/a`` -> ``-c*v/(a*(a + v))``), in the forward's formulas for ``p = j + m/q`` with
     ``q`` 2 or 4 (or ``-m/q``) ``r**m - s**m`` of the roots ``r = A**(1/q)``, ``s =
     B**(1/q)``, with ``r - s = (A - B)/(r**(q-1) + ... + s**(q-1))``
     (_root_power_difference), for p < -1 the same of ``1/A`` and ``1/B``
     (_reciprocal_power_difference), else ``power_excess`` (the expm1 form near 0)
     (_rule_power_minus_value).
   - ratios of exponentials: a product with a factor ``(p1*exp(a1) + p2*exp(a2))**-k``,
     ``cosh(u)**-k`` or ``sigmoid(u)**k`` (next to an ``exp``) is rewritten term by term as
     ``exp(r) * sigmoid(w)**j * sigmoid(-w)**(k-j)``, with the exponent ``j`` taken from the
     numerator's exponentials, so no ``exp`` overflows: ``exp(x)/(1+exp(x)) -> sigmoid(x)``,
     ``1/(1+exp(-x)) -> sigmoid(x)``, ``(x + exp(x) + 1)/(4*cosh(x/2)**2) ->
     (1 + x*sigmoid(-x))*sigmoid(x)``. (``1/cosh(u)**2`` alone stays: it is accurate.)
   - ``exp(a)/(exp(a) + exp(b) + exp(c))`` -> ``exp(-logsumexp(0, b - a, c - a))``
     (softmax; logsumexp as nested ``logaddexp``); ``exp(a)*exp(b)`` -> ``exp(a + b)``;
     ``exp(c - logsumexp(a_i))`` -> ``exp(-logsumexp(a_i - c))``, so the large parts
     cancel exactly; ``exp(-k*softplus(u))`` -> ``sigmoid(-u)**k``;
     ``(1 + exp(v))**k/expm1(v)**k`` -> ``tanh(v/2)**-k`` and ``sigmoid(u)**k/sigmoid(-u)**k``
     -> ``exp(k*u)`` (_rule_coth_half).
   - ``sqrt(a**2 + b**2)`` (any non-integer power of it, any number of squares, numbers
     included: ``1/sqrt(x**2 + 1)``) -> ``hypot(a, b)``; then ``hypot(a, b) - b`` for a
     positive number ``b`` -> ``hypot_excess(a, b)``, a quotient without the cancellation
     (the pseudo-Huber loss).
   - ``x*log(y)`` -> ``xlogy(x, y)`` (finite at ``x = y = 0``).
   - the normal tails: ``log(c*ndtr(u))`` -> ``log(c) + log_ndtr(u)`` (for c = 2, below
     u = -1; ``log1p(erf(u/sqrt(2)))`` above), ``log(c*erfc(u))`` -> the same with
     ``2c*ndtr(-sqrt(2)*u)``, ``log(c*erf(u))`` -> ``log(c) + log_erf(u)``; and (after these rules, _normal_tail_products) a product of
     ``exp(v)`` with ``erfc(u)**k`` or ``ndtr(u)**k`` (integer k, ``|k| <= 4``) whose
     quadratic cancels -> ``erfcx`` in the tail: ``exp(u**2)*erfc(u)`` -> ``erfcx(u)``,
     ``exp(-u**2/2)/ndtr(u)`` -> ``2/erfcx(-u/sqrt(2))`` for u < 0.
   - ``atanh(tanh(u))`` and ``asinh(sinh(u))`` -> ``u`` (real ``u``): evaluated as written,
     tanh rounds to 1 and sinh overflows (atanh(tanh(-16.72)) is -16.7205 in float64).

   - ``acosh(1 + u)`` -> ``log1p(u + sqrt(u)*sqrt(u + 2))`` (1 + u rounds to 1).

   Then, for a sum, ``factor_terms`` is tried and kept if it costs fewer operations. After
   these rules (which would undo them), in order: the normal tails' products (above); a
   root plus what it nearly cancels, ``hypot(u, b) + u`` for ``u`` of either sign and a
   number ``b`` (squareplus, ``sqrt(x**2 + 1) - x``, ``x/hypot(x, b) + 1``) ->
   ``hypot_plus(u, b)``, and ``hypot_plus(u, b) - hypot(u, b)`` -> ``u`` (_hypot_sums); a
   sum of sinh and cosh terms over ``cosh(u)**k``, distributed (_cosh_power_sums); these
   two run the rules again once where they changed something, which leave their results
   alone; then ``exp(k*v)*sigmoid(-c*exp(v))`` -> ``exp(k*v - c*exp(v))*sigmoid(c*exp(v))``
   (_sigmoid_exp_products), a sum with ``c*expm1(u)`` times ``exp(-u)`` or ``sinh(u/2)**-2``,
   distributed so that they meet; a sum with exps times an exp that falls doubly
   exponentially (``exp(-x - exp(-x))``), distributed so that the exps join; and
   ``expm1(v)**k*exp(u)`` -> ``where(k*v > 20, (-expm1(-v))**k*exp(u + k*v), ...)``
   (_expm1_partners); and a difference of squares ``1 - x**2`` -> ``(1 - x)*(1 + x)``
   (_difference_of_squares).
2. Removable singularities at 0 of a symbol (``sin(x)/x``, ``expm1(x)/x``, ``x/sin(x)``,
   ``log1p(x)/x`` and their derivatives), or at a dyadic point where a denominator
   vanishes (``log(x)/(x - 1)`` at 1): a :func:`~symgrad.stable_functions.removable`
   function, printed as a Taylor polynomial near that point and the closed form at a
   guarded argument elsewhere.
3. Piecewise branches that are not polynomials get their symbols guarded (the "double
   where"), so the untaken branch is evaluated at a safe point and cannot leak inf/NaN
   into gradients.
"""

from __future__ import annotations

import contextvars
import functools
import itertools

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from .probe import PROBE_FAILURES, moderate, probe_code, real_only
from .stable_functions import (
    DERIVATIVE_FORM,
    Removable,
    erfcx,
    finite,
    guard,
    hypot,
    hypot_excess,
    hypot_order,
    hypot_plus,
    log1mexp,
    log_erf,
    log_ndtr,
    log_sinh,
    logaddexp,
    ndtr,
    norm_ratio,
    power_excess,
    removable,
    sigmoid,
    softplus,
    to_elementary,
    xlogy,
)

_MAX_PASSES = 12
_MAX_EXPAND_OPS = 80  # numerators bigger than this are not distributed over a ratio
_FACTOR_MAX_TERMS = 6  # sums of exponentials with more terms are not factored ...
_FACTOR_MAX_DEGREE = 6  # ... nor those of exp(k*u) with k's numerator or denominator above this
_HYPOT_SUM_MAX_TERMS = 24  # sums with more terms are not searched for hypot(u, b) +- u pairs


# Whether _rule_power_minus_value may write a power minus its value as sums of roots or of
# reciprocals (stabilize's root_sums): set for the forward's formulas only.
_ROOT_SUMS = contextvars.ContextVar("root_sums", default=False)


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


_EXPAND_MAX_OPS = 40


def _expand(e: sympy.Expr) -> sympy.Expr:
    """``expand`` on small expressions only (exponents, arguments): bounded time."""
    return sympy.expand(e) if sympy.count_ops(e) <= _EXPAND_MAX_OPS else e


def _number(e: sympy.Expr) -> bool:
    return e.is_number and e.is_extended_real is True


def _exp_term(term: sympy.Expr):
    """``p*exp(a)`` -> (p, a); a number ``p`` -> (p, 0); else None."""
    coeff, rest = term.as_coeff_Mul()
    if rest == 1:
        return (coeff, sympy.Integer(0)) if _number(coeff) else None
    if isinstance(rest, sympy.exp):
        return coeff, rest.args[0]
    if rest.is_Pow and isinstance(rest.base, sympy.exp) and _number(rest.exp):
        return coeff, rest.exp * rest.base.args[0]
    return None


def _normalize_denominator(base: sympy.Expr):
    """``base`` as ``c*exp(v)*(1 + exp(w))`` with a positive number ``c``: (c, v, w) or None."""
    if isinstance(base, sympy.cosh):
        u = base.args[0]
        return sympy.S.Half, -u, 2 * u
    if isinstance(base, sympy.exp) or not base.is_Add or len(base.args) != 2:
        return None
    first, second = (_exp_term(t) for t in base.args)
    if first is None or second is None:
        return None
    if first[1] == 0 and second[1] == 0:
        return None
    if second[1] == 0:  # the constant first, so 1 + exp(w) keeps the user's sign of w
        first, second = second, first
    (p1, a1), (p2, a2) = first, second
    if not (p1.is_positive and p2.is_positive):
        return None
    return p1, a1, _expand(a2 - a1 + sympy.log(p2 / p1))


def _split_exponent(exponent: sympy.Expr, w: sympy.Expr, k: sympy.Expr):
    """``exponent = j*w + r`` with ``0 <= j <= k`` chosen to cancel ``w``'s terms."""
    w_terms = _expand(w).as_coefficients_dict()
    keys = sorted((m for m in w_terms if not m.is_number), key=sympy.default_sort_key)
    if not keys:
        return sympy.Integer(0), exponent
    m0 = keys[0]
    j = _expand(exponent).as_coefficients_dict().get(m0, sympy.Integer(0)) / w_terms[m0]
    if not _number(j):
        j = sympy.Integer(0)
    j = sympy.Min(sympy.Max(j, 0), k)
    return j, _expand(exponent - j * w)


def _exp_factors(term: sympy.Expr):
    """Split a product into the sum of its exponentials' exponents and the other factors."""
    exponent, others = sympy.Integer(0), []
    for f in sympy.Mul.make_args(term):
        if isinstance(f, sympy.exp):
            exponent += f.args[0]
        elif f.is_Pow and isinstance(f.base, sympy.exp) and _number(f.exp):
            exponent += f.exp * f.base.args[0]
        else:
            others.append(f)
    return exponent, sympy.Mul(*others)


def _has_exp(e: sympy.Expr) -> bool:
    return e.has(sympy.exp)


def _denominator_factor(f: sympy.Expr):
    """A factor as ``c**-k * exp(-k*v) * (1 + exp(w))**-k``: (kind, c, v, w, k) or None.

    ``kind`` is "sum" for a power of a sum of exponentials, "cosh" or "sigmoid".
    """
    if isinstance(f, sigmoid) or (f.is_Pow and isinstance(f.base, sigmoid) and _number(f.exp) and f.exp.is_positive):
        base, power = (f, sympy.Integer(1)) if isinstance(f, sigmoid) else (f.base, f.exp)
        return "sigmoid", sympy.Integer(1), sympy.Integer(0), _expand(-base.args[0]), power
    if f.is_Pow and _number(f.exp) and f.exp.is_negative:
        norm = _normalize_denominator(f.base)
        if norm is not None:
            kind = "cosh" if isinstance(f.base, sympy.cosh) else "sum"
            return (kind, *norm, -f.exp)
    return None


def _rule_ratio(node: sympy.Expr):
    """Ratios of exponentials -> sigmoids (see the module docstring).

    ``sigmoid(w)**a * sigmoid(-w)**b`` is ``exp(a*w) / (1 + exp(w))**(a+b)``, so every
    factor of that family with the same ``w`` (up to sign) joins one denominator
    ``(1 + exp(w))**k``; each numerator term's exponentials then choose ``j``.
    """
    if not (node.is_Mul or node.is_Pow):
        return None
    factors = list(sympy.Mul.make_args(node))
    found = [(i, d) for i, d in ((i, _denominator_factor(f)) for i, f in enumerate(factors)) if d is not None]
    if not found:
        return None
    sums_first = sorted(found, key=lambda item: (("sum", "sigmoid", "cosh").index(item[1][0]), item[0]))
    w = sums_first[0][1][3]
    c_total, exponent, k, kinds, used = sympy.Integer(1), sympy.Integer(0), sympy.Integer(0), set(), set()
    for index, (kind, c, v, w_i, k_i) in found:
        if w_i == w:
            pass
        elif _expand(w_i + w) == 0:
            # c*exp(v)*(1 + exp(-w)) == c*exp(v - w)*(1 + exp(w))
            v = v + w_i
        else:
            continue
        c_total *= c**-k_i
        exponent -= k_i * v
        k += k_i
        kinds.add(kind)
        used.add(index)
    rest = [f for i, f in enumerate(factors) if i not in used]
    sums = [f for f in rest if f.is_Add and _has_exp(f)]
    plain = [f for f in rest if not (f.is_Add and _has_exp(f))]
    if "sum" not in kinds and not sums and not any(_has_exp(f) for f in plain):
        return None  # cosh**-k or sigmoids alone are already stable
    numerator = sympy.Mul(*sums)
    if sums and sympy.count_ops(numerator) <= _MAX_EXPAND_OPS:
        terms = sympy.Add.make_args(sympy.expand_mul(numerator))
    else:
        terms = (numerator,)
    new_terms = []
    for term in terms:
        term_exponent, other = _exp_factors(sympy.Mul(term, *plain))
        j, r = _split_exponent(term_exponent + exponent, w, k)
        new_terms.append(other * c_total * sympy.exp(r) * sigmoid(w) ** j * sigmoid(-w) ** (k - j))
    return sympy.Add(*new_terms)


def _rule_minus_one(node: sympy.Expr):
    """``c*exp(u) + k`` -> ``c*expm1(u) + (k + c)`` while ``|k|`` shrinks; ``c - c*cos(u)``."""
    if not node.is_Add:
        return None
    constant, rest = node.as_coeff_Add()
    if constant == 0 or not _number(constant):
        return None
    terms = list(sympy.Add.make_args(rest))
    changed = False
    for index, term in enumerate(terms):
        coeff, f = term.as_coeff_Mul()
        if isinstance(f, sympy.exp) and _number(coeff) and abs(coeff + constant) < abs(constant):
            terms[index] = coeff * expm1(f.args[0])
            constant += coeff
            changed = True
        elif isinstance(f, sympy.cos) and coeff == -constant:
            terms[index] = 2 * constant * sympy.sin(f.args[0] / 2) ** 2
            constant = sympy.Integer(0)
            changed = True
        elif isinstance(f, sympy.cosh) and coeff == -constant:  # c*cosh(u) - c (accuracy hunt)
            terms[index] = 2 * coeff * sympy.sinh(f.args[0] / 2) ** 2
            constant = sympy.Integer(0)
            changed = True
        if constant == 0:
            break
    return sympy.Add(constant, *terms) if changed else None


def _positive_exp_sum(expr: sympy.Expr):
    """``sum(p_i*exp(a_i))`` with positive numbers ``p_i`` (numbers count as ``exp(log p)``):
    the exponents ``a_i + log(p_i)``; else None."""
    if not expr.is_Add:
        return None
    exponents = []
    for t in expr.args:
        term = _exp_term(t)
        if term is None or not term[0].is_positive:
            return None
        exponents.append(_expand(term[1] + sympy.log(term[0])))
    return exponents


def _logsumexp(exponents: list[sympy.Expr]) -> sympy.Expr:
    total = exponents[0]
    for a in exponents[1:]:
        total = logaddexp(total, a)
    return total


def _rule_factor_exp_sum(node: sympy.Expr):
    """``1/(exp(2*u) + 2*exp(u) + 1)`` -> ``1/(exp(u) + 1)**2``: a denominator that
    simplify expanded gets its factors back, which :func:`_rule_ratio` writes as sigmoids.

    (Sigmoid's derivative written as ``exp(x)/(1 + exp(x))`` came back expanded, and its
    logaddexp form was 14 float32 ulps off at x = -10, now 0.6.) Only sums of a few powers of one
    exponential, ``c*exp(k*u)`` with small rational ``k``: factor is a polynomial
    factorisation, and on 1 + exp(x) + exp(1000*x), of degree 1000 in exp(x), it did not
    finish in 300 s (and building the polynomial for exp(10**9*x) ran out of a 3 GB limit, review).
    """
    if not (node.is_Pow and _number(node.exp) and node.exp.is_negative and node.base.is_Add):
        return None
    base = node.base
    if len(base.args) > _FACTOR_MAX_TERMS:
        return None
    terms = [_exp_term(t) for t in base.args]
    if any(term is None for term in terms):
        return None
    arguments = [argument for _, argument in terms if argument != 0]
    if not arguments:
        return None
    for argument in arguments:
        ratio = argument / arguments[0]
        if not (ratio.is_Rational and abs(ratio.p) <= _FACTOR_MAX_DEGREE and ratio.q <= _FACTOR_MAX_DEGREE):
            return None
    factored = sympy.factor(base)
    if factored == base or not (factored.is_Pow or factored.is_Mul):
        return None
    # Only into factors c + a*exp(v) with numbers a, c > 0, which become sigmoids: a factor
    # with a difference (exp(x) - 1 from exp(2*x) - 1) would only add work, and one with
    # two exponentials, (exp(x) + exp(2*x) + 1), has no sigmoid form.
    for factor in sympy.Mul.make_args(factored):
        inner = factor.base if factor.is_Pow else factor
        if inner.is_number:
            continue
        constant, rest = inner.as_coeff_Add()
        term = _exp_term(rest)
        if not (constant > 0 and term is not None and term[1] != 0 and term[0] > 0):
            return None
    return factored**node.exp


def _rule_softmax(node: sympy.Expr):
    """``exp(a) / (exp(a) + exp(b) + exp(c))**k`` -> ``exp(a - k*logsumexp(a, b, c))``.

    For three or more exponentials (two are sigmoids, :func:`_rule_ratio`): every exp in
    the product joins one exponent, which the logsumexp keeps from overflowing.
    """
    if not (node.is_Mul or node.is_Pow):
        return None
    factors = list(sympy.Mul.make_args(node))
    for index, f in enumerate(factors):
        if f.is_Pow and _number(f.exp) and f.exp.is_negative:
            exponents = _positive_exp_sum(f.base)
            if exponents is not None and len(exponents) > 2:
                break
    else:
        return None
    exponent, other = _exp_factors(sympy.Mul(*(factors[:index] + factors[index + 1 :])))
    return other * sympy.exp(exponent + f.exp * _logsumexp(exponents))


def _rule_merge_exp(node: sympy.Expr):
    """``exp(a)*exp(b)`` -> ``exp(a + b)``: one exponent cannot overflow to ``inf*0``."""
    if not node.is_Mul:
        return None
    exps = [f for f in node.args if isinstance(f, sympy.exp)]
    sums = [f for f in node.args if f.is_Add and _has_exp(f)]
    if sums and any(f.args[0].has(logaddexp, softplus) for f in exps):
        # A normaliser exp(-logsumexp) next to a sum of exponentials: distribute, so each
        # term's exponentials join the normaliser's exponent (a softmax numerator).
        numerator = sympy.Mul(*sums)
        if sympy.count_ops(numerator) <= _MAX_EXPAND_OPS:
            return _exps_joined(numerator, [f for f in node.args if not (f.is_Add and _has_exp(f))])
    if len(exps) < 2:
        return None
    others = [f for f in node.args if not isinstance(f, sympy.exp)]
    return sympy.Mul(*others) * sympy.exp(sympy.Add(*(f.args[0] for f in exps)))


def _exps_joined(numerator: sympy.Expr, rest: list[sympy.Expr]) -> sympy.Expr:
    """``numerator*rest``, the sums of ``numerator`` distributed, with each term's
    exponentials joined into one exp (_exp_factors)."""
    terms = []
    for term in sympy.Add.make_args(sympy.expand_mul(numerator)):
        exponent, other = _exp_factors(sympy.Mul(term, *rest))
        terms.append(other * sympy.exp(exponent))
    return sympy.Add(*terms)


def _replace_each(expr: sympy.Expr, kind: type, rule) -> sympy.Expr:
    """``expr`` with each node of ``kind`` that ``rule`` rewrites (a result, not None)
    replaced, in one bottom-up pass, each distinct node tried once: the passes after the
    bottom-up rules."""
    made: dict[sympy.Expr, sympy.Expr | None] = {}

    def rewritten(node: sympy.Expr) -> sympy.Expr | None:
        if node not in made:
            made[node] = rule(node)
        return made[node]

    return expr.replace(lambda node: isinstance(node, kind) and rewritten(node) is not None, rewritten)


def _expm1_partners(expr: sympy.Expr) -> sympy.Expr:
    """_expm1_partner, _exp_into_sum, then _expm1_times_exp, on every product, after the
    bottom-up rules (which would factor the distributed sums again, and take the Piecewise's
    products apart)."""
    for rule in (_expm1_partner, _exp_into_sum, _expm1_times_exp):
        expr = _replace_each(expr, sympy.Mul, rule)
    return expr


def _exp_into_sum(node: sympy.Mul):
    """``exp(u)*(a + b*exp(w) + ...)*r``, where u falls doubly exponentially (a term ``-c*exp(v)``,
    c > 0, v sharing a symbol with w) -> ``a*exp(u)*r + b*exp(u + w)*r + ...``: where exp(u)
    underflows to 0, exp(w) (or expm1(w)) may overflow, and the product is 0*inf = nan where
    it is 0. The Gumbel density ``exp(-x - exp(-x))``'s second derivative, factored as
    ``(expm1(-x)**2 - exp(-x))*exp(-x - exp(-x))``, was nan from x = -45 in float32 (a fifth
    accuracy hunt). Each term's own exps then join the exponent, and _expm1_times_exp takes
    each expm1 term. Every such sum of the product is distributed, up to _MAX_EXPAND_OPS
    operations in all, each of at most _FACTOR_MAX_TERMS terms and with no quotient term;
    ``b*exp(w) - b`` first becomes ``b*expm1(w)`` (_expm1_pairs)."""
    falling = set().union(*(_falling_exponentials(f.args[0]) for f in node.args if isinstance(f, sympy.exp)))
    if not falling:
        return None
    sums = [
        f
        for f in node.args
        if f.is_Add
        and len(f.args) <= _FACTOR_MAX_TERMS
        and any(_grows_with(term, falling) for term in f.args)
        # (a quotient term may tend to a number where exp(u) underflows, and then its own
        # denominator, distributed, to 0: the cloglog's --save speed second derivative,
        # exp(x - exp(x))*(1 + exp(x)/expm1(-exp(x)))/expm1(-exp(x)), was 0/0 = nan from
        # x = -80 in float32 that way; found while checking this rule)
        and not any(_has_quotient(term) for term in f.args)
    ]
    if not sums:
        return None
    numerator = sympy.Mul(*(_expm1_pairs(f) for f in sums))
    if sympy.count_ops(numerator) > _MAX_EXPAND_OPS:
        return None
    return _exps_joined(numerator, [f for f in node.args if f not in sums])


def _expm1_pairs(total: sympy.Add) -> sympy.Expr:
    """``total`` with each pair of terms ``b*exp(w)`` and ``-b`` as ``b*expm1(w)``, for a b
    with symbols too (_rule_minus_one's are numbers): distributed as two exps, the pair
    cancelled where w is near 0 (exp(-x*y - exp(-x*y))'s mixed second derivative was 2.8%
    off at x*y = 1e-6 in float32, and its gradient not 0 at x*y = 0; found in review)."""
    terms = list(total.args)
    for index, term in enumerate(terms):
        powers = [f for f in sympy.Mul.make_args(term) if isinstance(f, sympy.exp)]
        if len(powers) != 1:
            continue
        b = term / powers[0]
        if -b in terms:
            terms[terms.index(-b)] = sympy.Integer(0)
            terms[index] = b * expm1(powers[0].args[0])
    return sympy.Add(*terms)


def _falling_exponentials(u: sympy.Expr) -> set[sympy.Symbol]:
    """The symbols of the v in u's terms ``-c*exp(v)`` (a positive number c)."""
    found: set[sympy.Symbol] = set()
    for term in sympy.Add.make_args(u):
        c, call = term.as_coeff_Mul()
        if isinstance(call, sympy.exp) and c.is_negative:
            found |= call.args[0].free_symbols
    return found


def _has_quotient(term: sympy.Expr) -> bool:
    """Whether ``term`` divides by something with a symbol (an exp's negative exponent aside)."""
    return any(
        f.is_Pow and f.exp.is_negative and f.base.free_symbols and not isinstance(f.base, sympy.exp)
        for f in sympy.Mul.make_args(term)
    )


def _grows_with(term: sympy.Expr, symbols: set[sympy.Symbol]) -> bool:
    """Whether ``term`` has an exp or expm1 of some of ``symbols``, which may overflow."""
    return any(
        isinstance(f, (sympy.exp, expm1)) and f.args[0].free_symbols & symbols for f in sympy.preorder_traversal(term)
    )


def _expm1_times_exp(node: sympy.Mul):
    """``expm1(v)**k*exp(u)*r`` (a positive integer k, u and v sharing a symbol) ->
    ``where(k*v > 20, (-expm1(-v))**k*exp(u + k*v)*r, expm1(v)**k*exp(u)*r)``: where v is
    large, expm1(v) overflows while exp(u) may underflow, and the product is 0*inf = nan
    where it is finite or 0. The Gumbel density ``exp(-x - exp(-x))``'s gradient ``exp(-x -
    exp(-x))*expm1(-x)`` was nan from x = -89 in float32, as naive autograd's is (a fifth
    accuracy hunt), and its second derivative, with ``expm1(-x)**2``, from x = -45. Up to
    k*v = 20, expm1(v)**k stays below e**20; above, ``(-expm1(-v))**k`` is at least 1 -
    k*exp(-20/k) (1 - 2e-9 for k = 1, 1 - 9e-5 for k = 2), so ``exp(u + k*v)`` overflows
    where the product does, or within that much of the format's largest number. (From v >
    0 on, the where made an inf of ``expm1(x/100)*exp(x)`` at x = 88 in float32, where it
    is 2.3e38; found in review.) For ``u = -k*v`` the product is ``(-expm1(-v))**k*r``,
    without a where; for u a positive multiple of v, exp(u) cannot underflow where
    expm1(v) overflows, and the product stays."""
    factors = sympy.Mul.make_args(node)
    calls = [f for f in factors if _expm1_power(f) is not None]
    exps = [f for f in factors if isinstance(f, sympy.exp) and f.args[0].free_symbols]
    for call in calls:
        v, k = _expm1_power(call)
        if _never_positive(v):
            # (a guarded branch's own argument, in its derivative: x < 0's guard(x, x < 0, -1),
            # where expm1 stays in (-1, 0] and a where would test what never holds)
            continue
        for power in exps:
            u = power.args[0]
            ratio = u / v
            if not u.free_symbols & v.free_symbols or ratio.is_number and ratio.is_positive:
                continue
            rest = sympy.Mul(*(f for f in factors if f is not call and f is not power))
            exponent = _expand(u + k * v)
            large = (-expm1(_expand(-v))) ** k * sympy.exp(exponent) * rest
            if exponent == 0:
                return large
            return sympy.Piecewise((large, k * v > 20), (node, True))
    return None


def _never_positive(v: sympy.Expr) -> bool:
    """Whether ``v``, an expression in one guard of a symbol and in nothing else, is positive
    nowhere: neither where the guard is its symbol (its condition holds and ``earlier``
    does not) nor at its safe point."""
    guards = v.atoms(guard)
    if len(guards) != 1:
        return False
    (g,) = guards
    x, condition, safe, earlier = (*g.args, sympy.false)[:4]
    taken, untaken = v.xreplace({g: x}), v.xreplace({g: safe})
    if taken.free_symbols != {x} or not _number(untaken) or untaken > 0:
        return False
    region = sympy.And(condition, sympy.Not(earlier), taken > 0)  # (SymPy may fold it to false)
    return region is sympy.false or _never_holds(region)


def _expm1_power(f: sympy.Expr) -> tuple[sympy.Expr, sympy.Integer] | None:
    """``expm1(v)**k``, for a v with symbols and a positive integer k (1 too): (v, k)."""
    call, k = f.as_base_exp()
    if isinstance(call, expm1) and call.args[0].free_symbols and k.is_Integer and k > 0:
        return call.args[0], k
    return None


def _expm1_partner(node: sympy.Mul):
    """A sum with a term ``c*expm1(u)``, times ``exp(-u)``, which underflows where expm1(u)
    overflows: the factor is distributed over the sum, and meets expm1(u) exactly,
    ``expm1(u)*exp(-u) = -expm1(-u)``. The gradient of ``(1 - exp(-x))/x``, ``(x -
    expm1(x))*exp(-x)/x**2``, was inf*0 = nan from x = 89 in float32, where naive autograd is
    right (found by an accuracy hunt); now it is ``(x*exp(-x) + expm1(-x))/x**2``.

    Likewise times ``sinh(u/2)**-2``: ``expm1(u)/sinh(u/2)**2 = -4/expm1(-u)``, only for the
    expm1 term, the others keeping the sinh: ``x/(1 - exp(-x))``'s gradient ``-(x -
    expm1(x))/(4*sinh(x/2)**2)`` was inf/inf = nan from x = 89 in float32; now it is
    ``-x/(4*sinh(x/2)**2) - 1/expm1(-x)``, 1.1% off from x = -88.7 to -92 (the missing term,
    1/|x| of the gradient, is below float32's range there, where the gradient is not).
    (Written all with ``4*sinh(u/2)**2 = -expm1(u)*expm1(-u)`` it was 0 there, and its double
    backward nan; found in review.)
    """
    for total in (f for f in node.args if f.is_Add and f.has(expm1)):
        for term in total.args:
            c, call = term.as_coeff_Mul()
            if not isinstance(call, expm1):
                continue
            u = call.args[0]
            others = [t for t in total.args if t is not term]
            rest = [f for f in node.args if f is not total]
            if sympy.exp(-u) in rest:
                rest.remove(sympy.exp(-u))
                spread = sympy.Add(*(t * sympy.exp(-u) for t in others)) - c * expm1(-u)
                return sympy.Mul(*rest) * spread
            half = sympy.sinh(_expand(u / 2)) ** -2
            if half in rest:
                rest.remove(half)
                spread = sympy.Add(*(t * half for t in others)) - 4 * c / expm1(_expand(-u))
                return sympy.Mul(*rest) * spread
    return None


def _cosh_power_sums(expr: sympy.Expr) -> sympy.Expr:
    """A sum whose every term has sinh(u) or cosh(u) in it, over ``cosh(u)**k`` (k >= 2), is
    distributed, so that _rule_sinh_over_cosh meets each term's powers: LiSHT ``x*tanh(x)``'s
    second derivative with --save speed, ``-(2*x*sinh(x) - 2*cosh(x))/cosh(x)**3``, was
    inf/inf = nan from |x| = 90 in float32 (found by an accuracy hunt); distributed it is
    ``-2*x*tanh(x)/cosh(x)**2 + 2/cosh(x)**2``."""

    def spread(node: sympy.Mul) -> sympy.Expr | None:
        # (integer powers: _rule_sinh_over_cosh takes no others; found in review)
        powers = [f for f in node.args if f.is_Pow and isinstance(f.base, sympy.cosh) and f.exp.is_Integer and f.exp <= -2]
        for power in powers:
            u = power.base.args[0]
            for total in (f for f in node.args if f.is_Add):
                if all(t.has(sympy.sinh(u), sympy.cosh(u)) for t in total.args):
                    rest = sympy.Mul(*(f for f in node.args if f is not total and f is not power))
                    return rest * sympy.Add(*(t * power for t in total.args))
        return None

    return _replace_each(expr, sympy.Mul, spread)


def _sigmoid_exp_products(expr: sympy.Expr) -> sympy.Expr:
    """_sigmoid_of_exp on every product, after the bottom-up rules: _rule_ratio would take
    the joined exponential apart again."""
    return _replace_each(expr, sympy.Mul, _sigmoid_of_exp)


def _sigmoid_of_exp(node: sympy.Expr):
    """``exp(k*v)*sigmoid(-c*exp(v))**j`` -> ``exp(k*v - j*c*exp(v))*sigmoid(c*exp(v))**j``
    (numbers k, c, j > 0): where exp(v) overflows the sigmoid is 0, and the product inf*0 =
    nan, while the joined exponent is -inf. TanhExp ``x*tanh(exp(x))``'s gradient,
    ``4*x*exp(x)*sigmoid(-2*exp(x))*sigmoid(2*exp(x)) + tanh(exp(x))``, was nan from x = 89
    in float32 (found by an accuracy hunt). (Only of exp(v): ``c*exp(v)`` is positive, so
    ``exp(-c*exp(v))`` cannot overflow.)"""
    if not node.is_Mul:
        return None
    exponents = [f.args[0] for f in node.args if isinstance(f, sympy.exp)]
    for factor in node.args:
        base, power = factor.as_base_exp()
        if not (isinstance(base, sigmoid) and power.is_number and power.is_positive):
            continue
        c, inner = base.args[0].as_coeff_Mul()
        if not (c.is_negative and isinstance(inner, sympy.exp)):
            continue
        merged = next((e for e in exponents if (e / inner.args[0]).is_number and (e / inner.args[0]).is_positive), None)
        if merged is not None:
            rest = sympy.Mul(*(f for f in node.args if f is not factor and f != sympy.exp(merged)))
            return rest * sympy.exp(merged + power * c * inner) * sigmoid(-c * inner) ** power
    return None


def _lse_args(expr: sympy.Expr) -> list[sympy.Expr]:
    if isinstance(expr, logaddexp):
        return _lse_args(expr.args[0]) + _lse_args(expr.args[1])
    return [expr]


def _rule_exp_lse(node: sympy.Expr):
    """``exp(c + k*logsumexp(a_i))`` -> ``exp(k*logsumexp(a_i + c/k))``.

    The exponent's two large parts cancel inside the logsumexp, exactly, instead of after
    rounding: ``exp(x - logsumexp(0, x, y))`` is accurate at ``x = y = 1e4`` this way.
    """
    if not isinstance(node, sympy.exp):
        return None
    for term in sympy.Add.make_args(node.args[0]):
        coeff, f = term.as_coeff_Mul()
        if isinstance(f, softplus) and coeff.is_negative:  # exp(-k*softplus(u)) == sigmoid(-u)**k
            return sympy.exp(node.args[0] - term) * sigmoid(-f.args[0]) ** -coeff
    if not node.args[0].is_Add:
        return None
    found = [t for t in node.args[0].args if isinstance(t.as_coeff_Mul()[1], logaddexp)]
    if len(found) != 1:
        return None
    coeff, lse = found[0].as_coeff_Mul()
    rest = node.args[0] - found[0]
    if not rest.free_symbols or coeff == 0:
        return None
    return sympy.exp(coeff * _logsumexp([_expand(a + rest / coeff) for a in _lse_args(lse)]))


def _rule_log(node: sympy.Expr):
    if isinstance(node, log1p):
        inner = node.args[0]
        term = _exp_term(inner)
        if term is not None and term[1] != 0 and term[0].is_positive:
            p, a = term
            return softplus(_expand(a + sympy.log(p)))
        return None
    if not isinstance(node, sympy.log):
        return None
    arg = node.args[0]
    factors = sympy.Mul.make_args(arg)
    powers = [f for f in factors if f.is_Pow and _number(f.base) and f.base.is_positive and f.exp.free_symbols]
    if powers and all(f.exp.is_extended_real for f in powers):
        # log(b**u) for a number b > 0 is u*log(b), and splits off a product (the rest is
        # positive wherever the log is real): 10**u over- or underflows, and simplify's
        # log(10**(-x**3*exp(x))) was -inf in float64 from x = 3 (fuzz campaign).
        rest = sympy.Mul(*(f for f in factors if f not in powers))
        return sympy.Add(*(f.exp * sympy.log(f.base) for f in powers)) + sympy.log(rest)
    if isinstance(arg, sigmoid):
        return -softplus(-arg.args[0])
    if isinstance(arg, sympy.cosh) and not arg.args[0].has(sympy.Piecewise):
        # (Not of a Piecewise, such as an inner log-cosh: the form repeats its argument, and
        # nested four deep it took 70 s to build; found in review.)
        return _log_cosh(arg.args[0])
    scale, call = arg.as_coeff_Mul()
    if isinstance(call, expm1) and scale.is_positive:
        # log(expm1(u)) (the inverse of softplus): expm1 overflows from u = 89 in float32
        # where the log is u; u + log(1 - exp(-u)) never does (found by an accuracy hunt).
        # (For u < 0 both are undefined.)
        u = call.args[0]
        return sympy.log(scale) + u + log1mexp(-u)
    if isinstance(call, expm1) and scale.is_negative:
        # log(1 - exp(u)): as log(-expm1(u)) it is 0 in float32 from u = -17, where it is
        # about -exp(u) (found by an accuracy hunt)
        return sympy.log(-scale) + log1mexp(call.args[0])
    if isinstance(call, sympy.tanh) and scale.is_nonzero and not call.args[0].has(sympy.Piecewise):
        # log(tanh(u)), real for u > 0: tanh rounds to 1, and the log, about -2*exp(-2u),
        # was 2e-4 off in float32 at u = 5, 96% at 9 and 0 above (found by an accuracy hunt).
        # 1/tanh(u) = 1 + 2/expm1(2u), with nothing to cancel at any u > 0.
        v = _expand(2 * (call.args[0] if scale.is_positive else -call.args[0]))
        return sympy.log(abs(scale)) - log1p(2 / expm1(v))
    sinh_ratio = _log_sinh_ratio(arg)  # (log(sinh(u)) itself too)
    if sinh_ratio is not None:
        return sinh_ratio
    difference = _exp_difference(arg)
    if difference is not None:
        # log(p*exp(a) - p*exp(b)), real where a > b: as written each exp overflows from 89 in
        # float32 and underflows below -104, and their difference rounds to 0 where a is near b
        p, a, b = difference
        return sympy.log(p) + a + log1mexp(_expand(b - a))
    hand_written_asinh = _asinh_argument(arg)
    if hand_written_asinh is not None:
        return hand_written_asinh
    if arg.is_Add:
        constant, rest = arg.as_coeff_Add()
        if constant == 1 and _normalize_denominator(arg) is None and _positive_exp_sum(arg) is None:
            # log(1 + exp(u)) is left to the softplus rules below, and log(1 + exp(a) +
            # exp(b)) to logaddexp: as log1p it overflowed (found by an accuracy hunt)
            return log1p(rest)
    content, primitive = arg.as_content_primitive() if arg.is_Add else (sympy.Integer(1), arg)
    if not content.is_positive:
        return None
    exponents = _positive_exp_sum(primitive)
    if exponents is not None and (len(exponents) > 2 or all(a != 0 for a in exponents)):
        return sympy.log(content) + _logsumexp(exponents)
    norm = _normalize_denominator(primitive) if primitive.is_Add else None
    if norm is None:
        return None
    c, v, w = norm
    return sympy.log(content * c) + v + softplus(w)


def _exp_difference(arg: sympy.Expr):
    """(p, a, b) for ``p*exp(a) - p*exp(b)`` (a number p > 0, a and b not both numbers), else
    None. (``exp(a) - 1`` is expm1's, which the rules above take.)"""
    if not arg.is_Add or len(arg.args) != 2:
        return None
    terms = [_exp_term(t) for t in arg.args]
    if any(t is None for t in terms):
        return None
    (p, a), (q, b) = terms
    if q.is_positive:
        (p, a), (q, b) = (q, b), (p, a)
    if not (p.is_positive and q == -p) or (a.is_number and b.is_number):
        return None
    return p, a, b


# Positive functions whose logarithm has a form of its own: log(exp(u)) = u, log(sigmoid(u))
# = -softplus(-u), log(cosh(u)) (_log_cosh). (Not ndtr and erfc: _rule_normal_tail takes
# their number coefficients along.)
_LOG_SPLITS = (sympy.exp, sigmoid, sympy.cosh)


def _rule_log_product(node: sympy.Expr):
    """``log(f**k*g*...)`` -> ``k*log(f) + log(g*...)`` for the factors ``f`` of _LOG_SPLITS
    (and positive numbers), which are positive, so that the sum is equal wherever the log
    is real: a density's logarithm, ``log(exp(-x**2/2)/sqrt(2*pi))``, was -inf from |x| = 14
    in float32 where the product underflows, and the logistic one, ``log(sigmoid(x)*(1 -
    sigmoid(x)))``, from |x| = 88 (found by an accuracy hunt)."""
    if not (isinstance(node, sympy.log) and (node.args[0].is_Mul or node.args[0].is_Pow)):
        return None
    split, numbers, kept = [], [], []
    for factor in sympy.Mul.make_args(node.args[0]):
        # (exp(u).as_base_exp() is (E, u))
        base, k = (factor, sympy.S.One) if isinstance(factor, sympy.exp) else factor.as_base_exp()
        # (An argument that is not provably real, such as x/s, is real wherever the code
        # computes: over the reals, as in _rule_inverse.)
        if isinstance(base, _LOG_SPLITS) and k.is_extended_real and base.args[0].is_extended_real is not False:
            split.append(k * (base.args[0] if isinstance(base, sympy.exp) else sympy.log(base)))
        elif factor.is_number and factor.is_positive:
            numbers.append(factor)
        else:
            kept.append(factor)
    if not split:
        return None  # no function of _LOG_SPLITS: nothing gained
    return sympy.Add(*split, sympy.log(sympy.Mul(*numbers)), sympy.log(sympy.Mul(*kept)))


def _rule_normal_tail(node: sympy.Expr):
    """``log(c*ndtr(u))`` and ``log(c*erfc(u))`` as ``log_ndtr`` (see the module docstring).

    ``ndtr(u)`` and ``erfc(u)`` underflow in float32 from u = -14 and 10 (float64: -38 and
    27), where their logarithms are about ``-u**2/2`` and ``-u**2``: the log was -inf there.
    (Their products with ``exp`` are rewritten after these rules: _normal_tail_products.)
    """
    if isinstance(node, sympy.log):
        scale, call = node.args[0].as_coeff_Mul()
        if not scale.is_positive:
            return None
        if isinstance(call, ndtr):
            return _log_scaled_ndtr(scale, call.args[0])
        if isinstance(call, sympy.erfc):  # erfc(u) = 2*ndtr(-sqrt(2)*u)
            return _log_scaled_ndtr(2 * scale, _expand(-_SQRT2 * call.args[0]))
        if isinstance(call, sympy.erf):  # rounds to 1 from u = 4 in float32
            return sympy.log(scale) + log_erf(call.args[0])
    return None


def _log_scaled_ndtr(scale: sympy.Expr, u: sympy.Expr) -> sympy.Expr:
    """``log(scale*ndtr(u))`` for a number ``scale > 0``.

    ``log(scale) + log_ndtr(u)`` cancels where ``scale*ndtr(u)`` is near 1, which it can be
    for a scale above 1. The common one is 2 (``log(erfc(x))``, ``log(1 + erf(x))``), 0 at
    u = 0: there ``log1p(erf(u/sqrt(2)))`` is exact, and it cancels only below u = -1, where
    the sum has no cancellation left. (At x = 1e-8 in float32 both ``log(erfc(x))`` as
    written, which rounds ``erfc`` to 1, and the sum alone are 100% off.)
    """
    if scale == 2:
        return sympy.Piecewise(
            (sympy.log(2) + log_ndtr(u), u < -1),
            (log1p(sympy.erf(_expand(u / _SQRT2))), True),
        )
    return sympy.log(scale) + log_ndtr(u)


def _normal_tail_products(expr: sympy.Expr) -> sympy.Expr:
    """Products of ``exp(v)`` with ``erfc(u)**k`` or ``ndtr(u)**k`` whose quadratic cancels,
    through ``erfcx`` (:func:`_tail_product`): ``exp(u**2)*erfc(u)`` is inf*0 from u = 10
    in float32, and the probit gradient ``pdf(u)/ndtr(u)`` 0/0 from u = -14.

    After the bottom-up rules, and once: the Piecewise a quotient becomes keeps the product
    as written on its accurate side, which the rules would rewrite again.
    """
    return _replace_each(expr, sympy.Mul, _tail_mul)


def _hypot_sums(expr: sympy.Expr) -> sympy.Expr:
    """Each sum's ``q*hypot(u, b)/H + q*s*u/H`` pairs (s = +-1, H that hypot) as
    ``q*hypot_plus(s*u, b)/H`` (:func:`_hypot_sum`).

    After the bottom-up rules: ``log(x + sqrt(x**2 + 1))`` has become ``asinh(x)`` and
    ``hypot(x, 1) - 1`` ``hypot_excess(x, 1)`` by then, which are cheaper.
    """
    return _replace_each(expr, sympy.Add, _hypot_sum)


def _hypot_sum(node: sympy.Add) -> sympy.Expr | None:
    """``p + q`` with ``p/q = s*u/hypot(u, b)`` -> ``q*hypot_plus(s*u, b)/hypot(u, b)`` for a
    nonzero number ``b``, and ``k*hypot_plus(u, b) - k*hypot(u, b)`` -> ``k*u``, repeated
    while a pair is left; None where there is none.

    ``hypot(u, b) + s*u`` cancels where ``s*u`` is negative and large next to ``b``:
    squareplus ``(x + sqrt(x**2 + 4))/2`` was 0 in float32 from x = -1e4 (truth 1e-4), and
    its gradient ``x/(2*hypot(x, 2)) + 1/2`` likewise; ``sqrt(x**2 + 1) - x`` from 4096 (found
    by an accuracy hunt). So would the derivatives of ``r = hypot_plus(u, b)``: ``r/h**2 -
    u*r/h**3`` where ``u`` is large and positive, and ``-b/h**2 + r*b/h**3`` where ``u`` is
    small. Not where ``s*u`` is nonnegative, which cannot cancel; nor for a number ``u``
    (_rule_hypot_excess); nor for a ``b`` that is not a number (``hypot(x, y) - y``): it can
    be 0, and the quotient is then 0/0 at the origin, where the difference is 0 (found in
    review).
    """
    rewritten = None
    while node.is_Add:
        pair = _hypot_pair(node.args)
        if pair is None:
            break
        p, q, replacement = pair
        rest = list(node.args)
        rest.remove(p)  # (by equality: q is built afresh, equal to a term but not the same object)
        rest.remove(q)
        node = rewritten = sympy.Add(*rest, replacement)
    return rewritten


def _hypot_pair(terms: tuple[sympy.Expr, ...]):
    """The first ``(p, q, p + q rewritten)`` of _hypot_sum's pairs among ``terms``, or None."""
    if len(terms) > _HYPOT_SUM_MAX_TERMS:
        return None
    present = set(terms)
    # (each term's factors, powers by their base)
    factors_of = {t: {f.base if f.is_Pow else f for f in sympy.Mul.make_args(t)} for t in terms}
    factors = set().union(*factors_of.values())
    for plus in sorted((f for f in factors if isinstance(f, hypot_plus)), key=sympy.default_sort_key):
        root = hypot_plus.root(*plus.args)
        for p in terms:
            q = -p / plus * root
            if q in present and q != p:
                return p, q, p / plus * plus.args[0]
    for root in sorted((f for f in factors if isinstance(f, hypot)), key=sympy.default_sort_key):
        for u, b in (root.args, root.args[::-1]):
            if u.is_number or not (b.is_number and b.is_nonzero):
                continue
            # (a pair has a term with the root or u as a factor: only those are tried)
            for p in (t for t in terms if {root, u} & factors_of[t]):
                # p/q = s*u/root, so q = s*p*root/u
                for s in (1, -1):
                    q = s * p * root / u
                    if q in present and q != p and not (s * u).is_nonnegative:
                        return p, q, q * hypot_plus(s * u, b) / root
    return None


def _tail_mul(node: sympy.Mul) -> sympy.Expr | None:
    factors = sympy.Mul.make_args(node)
    if not any(_tail_power(f) for f in factors):
        return None  # (the common case, before any product is rebuilt)
    direct = _tail_product(factors)
    if direct is not None:
        return direct
    # A sum over a power of ndtr or erfc (a quotient's derivative, simplified: (x*exp(-x**2/2)
    # *ndtr(x) + exp(-x**2)/sqrt(2*pi))/ndtr(x)**2) is distributed where a term cancels.
    sums = [f for f in factors if f.is_Add]
    if len(sums) != 1:
        return None
    others = [f for f in factors if f is not sums[0]]
    terms = [_tail_product((*others, *sympy.Mul.make_args(t))) for t in sums[0].args]
    if all(t is None for t in terms):
        return None
    return sympy.Add(*(new if new is not None else sympy.Mul(*others, t) for new, t in zip(terms, sums[0].args)))


_TAIL_MAX_POWER = 4


def _tail_power(f: sympy.Expr):
    """``(u, k, is_ndtr)`` for a factor ``erfc(u)**k`` or ``ndtr(u)**k`` (a small integer k),
    else None."""
    base, power = (f.base, f.exp) if f.is_Pow else (f, sympy.Integer(1))
    if not (power.is_Integer and power != 0 and abs(power) <= _TAIL_MAX_POWER):
        return None
    if isinstance(base, (sympy.erfc, ndtr)):
        return base.args[0], power, isinstance(base, ndtr)
    return None


_TAIL_MAX_FACTORS = 3  # products with more powers of erfc and ndtr are left as they are


def _tail_product(factors: tuple[sympy.Expr, ...], kept: frozenset = frozenset()):
    """The product of ``factors`` with ``exp(v)*erfc(u)**k`` as ``exp(v - k*u**2)*erfcx(u)**k``
    (``ndtr`` likewise) where that leaves a smaller exponent, else None; each such factor in
    turn (but those in ``kept``).

    The ``erfcx`` form is taken only in the tail it is for (erfc: u > 0, ndtr: u < 0), and
    the product as written elsewhere: on the other side ``erfc`` and ``ndtr`` are near 2
    and 1, and ``erfcx`` of a negative argument is about ``2*exp(u**2)``, which overflows
    where the product need not (``exp(-u**2/2)*ndtr(u)``, the skew-normal density, was nan
    from u = 14 in float32 that way; found in review), and whose ``exp`` amplifies the
    rounding of a scaled argument (ndtr's 1/sqrt(2), or the user's) by ``2*u**2`` (130
    float64 ulps of the probit gradient at u = 20, where the quotient as written is exact;
    ``exp(x**2/2)*erfc(x/sqrt(2))/2`` as ``erfcx`` alone was 515 ulps off at x = -25.5,
    where the product is 2.7: found by a fuzz campaign in review).
    """
    product = sympy.Mul(*factors)  # (a distributed term's powers joined)
    factors = sympy.Mul.make_args(product)
    exponent, others = _exp_factors(product)
    others = sympy.Mul.make_args(others)
    if exponent == 0 or sum(1 for f in others if _tail_power(f)) > _TAIL_MAX_FACTORS:
        return None
    for f in others:
        tail = None if f in kept else _tail_power(f)
        if tail is None:
            continue
        u, power, is_ndtr = tail
        if is_ndtr:  # ndtr(u) = erfc(-u/sqrt(2))/2 = exp(-u**2/2)*erfcx(-u/sqrt(2))/2
            quadratic, scaled, in_tail = -(u**2) / 2, erfcx(_expand(-u / _SQRT2)) / 2, u < 0
        else:  # erfc(u) = exp(-u**2)*erfcx(u)
            quadratic, scaled, in_tail = -(u**2), erfcx(u), u > 0
        left = _expand(exponent + power * quadratic)
        if _size(left) >= _size(exponent):
            continue
        rest = sympy.Mul(*(g for g in others if g is not f))
        product = rest * sympy.exp(left) * scaled**power
        product = _tail_product(sympy.Mul.make_args(product), kept) or product  # (the next factor)
        elsewhere = _tail_product(factors, kept | {f}) or sympy.Mul(*factors)
        return sympy.Piecewise((product, in_tail), (elsewhere, True))
    return None


def _asinh_argument(arg: sympy.Expr) -> sympy.Expr | None:
    """log(u + sqrt(u**2 + 1)) is asinh(u), and log(sqrt(u**2 + 1) - u) is -asinh(u).

    As written, u + hypot(u, 1) cancels for u < 0: in float32 the log is 1e-4 off at
    u = -100 and -inf from u = -4096, and 0 at u = -1e-30; torch.asinh is within an ulp
    (found by an accuracy hunt over formulas users write by hand). The rules run
    bottom-up, so the root is already hypot(u, 1) here, or hypot_excess(u, 1) (which is
    hypot(u, 1) - 1) where u has a negative constant term; and u + hypot(u, 1) may be
    flattened into one sum with u's own terms (found in review).
    """
    if not arg.is_Add:
        return None

    def one(v: sympy.Expr) -> bool:
        return bool((v - 1).is_zero)  # (Float(1.0) == 1 is False in SymPy)

    for term in arg.args:
        if isinstance(term, hypot) and any(map(one, term.args)):
            rest = arg - term
        elif isinstance(term, hypot_excess) and one(term.args[1]):
            rest = arg - term - 1
        else:
            continue
        u = term.args[1] if one(term.args[0]) else term.args[0]
        if _expand(rest - u) == 0:
            return sympy.asinh(u)
        if _expand(rest + u) == 0:
            return -sympy.asinh(u)
    return None


def _log_cosh(u: sympy.Expr) -> sympy.Expr:
    """log(cosh(u)) (the log-cosh loss), finite and accurate at every u.

    As written, cosh overflows from |u| = 89 in float32 (the loss is then inf where it is
    |u| - log 2), and log of 1 + u**2/2 loses the small part near 0. Below |u| = 1, cosh(u)
    is 1 + 2*sinh(u/2)**2 exactly, whose log1p keeps it; above, log(cosh(u)) is
    |u| - log(2) + softplus(-2|u|), whose terms cancel by at most 4x there (found by an
    accuracy hunt). The condition is two linear bounds, not |u| < 1, so that _guard_piecewise
    can guard the branches (the "double where": sinh(u/2)**2 overflows from |u| = 179 in
    float32 on the branch not taken; found in review).
    """
    magnitude = sympy.Abs(u)
    return sympy.Piecewise(
        (log1p(2 * sympy.sinh(u / 2) ** 2), (u > -1) & (u < 1)),
        (magnitude - sympy.log(2) + softplus(-2 * magnitude), True),
    )


def _log_sinh_ratio(arg: sympy.Expr) -> sympy.Expr | None:
    """``log(c*u**m*sinh(u)**k)`` for a number c and integers m and k, else None. As written
    sinh overflows from |u| = 89 in float32, where the log of sinh(u) is u - log(2)
    (stable_functions.log_sinh): ``log(k) - log(sinh(k))``, ``log(x/sinh(x))`` (the von
    Mises-Fisher log-normaliser) and ``log(sinh(x)**2)`` were -inf there (found by accuracy
    hunts).

    - Without u**m: ``log(|c|) + k*log_sinh(|u|)`` for an even k, ``k*log_sinh(+-u)`` for an
      odd one (real where c*sinh(u)**k > 0: ``log(sinh(u))`` for u > 0, ``log(-sinh(u))``
      for u < 0), everywhere: nothing cancels.
    - With it, for m = +-k and c > 0 (the product positive for either sign of u): ``log(c) +
      m*log(|u|) + k*log_sinh(|u|)``, everywhere for m = k, whose terms have one sign; for
      m = -k (``u/sinh(u)``) only above |u| = 1, and below ``log1p(c*u**m*sinh(u)**k - 1)``,
      the product whole, near 1 there: the split terms would cancel near 0, and its
      removable singularity at 0 gets its series. (That form for m = k, whose product is
      near 0 there, was -inf at x = 1e-4 for log(x*sinh(x)); found in review.) The
      condition is two linear bounds, as in _log_cosh, so that the branches are guarded.
    """
    factors = sympy.Mul.make_args(arg)
    calls = [f for f in factors if isinstance(f.as_base_exp()[0], sympy.sinh)]
    if len(calls) != 1:
        return None
    base, k = calls[0].as_base_exp()
    u = base.args[0]
    if not k.is_Integer or u.is_number or u.has(sympy.Piecewise):
        return None
    c = sympy.Mul(*(f for f in factors if f.is_number))
    others = sympy.Mul(*(f for f in factors if not f.is_number and f is not calls[0]))
    if others == 1 and (c.is_positive or c.is_negative and k % 2 == 1):
        # (an even power times c < 0 is never real)
        return sympy.log(abs(c)) + k * log_sinh(sympy.Abs(u) if k % 2 == 0 else u if c.is_positive else -u)
    # (x*y/sinh(x*y): the other factors are a number times a power of u, 2*x/sinh(2*x) too)
    m = next((m for m in (-k, k) if (others / u**m).is_number), None)
    if m is None or not (c * others / u**m).is_positive:
        return None
    c, magnitude = c * others / u**m, sympy.Abs(u)
    split = sympy.log(c) + m * sympy.log(magnitude) + k * log_sinh(magnitude)
    if m == k:
        return split  # (log(x*sinh(x)): the terms have one sign, and nothing cancels near 0)
    small = log1p(arg - 1)
    if len(small.free_symbols) == 1:
        # (its series at 0 here: _removable_singularities does not look inside a Piecewise)
        (symbol,) = small.free_symbols
        made = removable(small, symbol)
        small = made(symbol) if made is not None else small
    return sympy.Piecewise((small, (u > -1) & (u < 1)), (split, True))


def _size(e: sympy.Expr) -> int:
    return int(sympy.count_ops(e)) + sum(1 for a in sympy.preorder_traversal(e) if a.is_Symbol)


_SQRT2 = sympy.sqrt(2)


_LOG2 = sympy.log(2)


def same_number(a: sympy.Expr, b: sympy.Expr) -> bool:
    """``a == b`` for numbers, a Float equal to a Rational included: SymPy's Float(0.5) is
    not S.Half, and ``sigmoid(x) - 0.5`` should meet the rule ``sigmoid(x) - 1/2`` does."""
    if a == b:
        return True
    if (a.is_Float or b.is_Float) and all(n.is_Rational or n.is_Float for n in (a, b)):
        return sympy.Rational(a) == sympy.Rational(b)
    return False


def _near_cancellation(c: sympy.Expr, k: sympy.Expr) -> bool:
    """Whether ``c + k*t`` for ``t`` in [0, 1] cancels as ``t`` nears 1 without crossing 0:
    numbers of opposite signs, ``c + k`` of ``c``'s sign and at most ``|k|/8`` (beyond
    that, the rounding of ``k*t`` is at most 8 ulps of the sum as written)."""
    if not (_number(c) and _number(k)) or not (c * k).is_negative:
        return False
    margin = c + k
    return bool((margin * c).is_positive) and bool(8 * abs(margin) <= abs(k))


def _affine(v: sympy.Expr) -> bool:
    """Whether ``v`` is a sum of numbers times symbols: it overflows only where its inputs
    are near the largest float. (k*v/(a + v) is inf/inf = nan where v overflows, and the sum
    it replaces was k: 1/(1 + x**2) - 1 from |x| = 1.9e19 in float32, 1/(1 + sinh(x)) - 1
    from x = 89; found in review.)"""
    terms = sympy.Add.make_args(v)
    return all(t.as_coeff_Mul()[1].is_Symbol for t in terms)


def _rule_add(node: sympy.Expr):
    """Cancellations between a constant and a bounded function (see the docstring)."""
    if not node.is_Add:
        return None
    constant, terms = node.as_coeff_Add()
    terms = sympy.Add.make_args(terms)
    for term in terms:
        coeff, f = term.as_coeff_Mul()
        rest = node - term
        if constant != 0:
            remainder = rest - constant
            if isinstance(f, sympy.erf) and same_number(constant, coeff):  # c*(1 + erf(u))
                return remainder + 2 * coeff * ndtr(_SQRT2 * f.args[0])
            if isinstance(f, sympy.erf) and same_number(constant, -coeff):  # c*(erf(u) - 1)
                return remainder - 2 * coeff * ndtr(-_SQRT2 * f.args[0])
            if isinstance(f, sympy.erfc) and same_number(constant, -2 * coeff):  # c*(erfc(u) - 2)
                return remainder - 2 * coeff * ndtr(_SQRT2 * f.args[0])
            if isinstance(f, ndtr) and same_number(constant, -coeff):  # c*(ndtr(u) - 1)
                return remainder - coeff * ndtr(-f.args[0])
            if isinstance(f, sympy.tanh) and same_number(constant, coeff):  # c*(1 + tanh(u))
                return remainder + 2 * coeff * sigmoid(2 * f.args[0])
            if isinstance(f, sympy.tanh) and same_number(constant, -coeff):  # c*(1 - tanh(u))
                return remainder + 2 * constant * sigmoid(-2 * f.args[0])
            if isinstance(f, sigmoid) and same_number(constant, -coeff):  # c*(1 - sigmoid(u))
                return remainder + constant * sigmoid(-f.args[0])
            if isinstance(f, sigmoid) and same_number(constant, -coeff / 2):  # c*(1 - 2*sigmoid(u))
                # (the sigmoid derivative's own derivative s*(1 - s)*(1 - 2*s) cancelled
                # near 0; found by an accuracy hunt; sigmoid(x) - 0.5, 0 in float32 at x =
                # 1e-8, by a fourth)
                return remainder - constant * sympy.tanh(f.args[0] / 2)
            if f.is_Pow and f.exp == -1 and isinstance(f.base, sigmoid) and same_number(constant, -coeff):
                # c*(1/sigmoid(u) - 1): BCE's derivative by its target, log(1/sigmoid(x) - 1),
                # was log(0) = -inf from x = 17 in float32 where it is -x (accuracy hunt)
                return remainder + coeff * sympy.exp(-f.base.args[0])
            if f.is_Pow and f.exp == 2 and isinstance(f.base, sympy.tanh) and same_number(constant, -coeff):
                return remainder + constant * sympy.cosh(f.base.args[0]) ** -2
            if f.is_Pow and f.exp == 2 and isinstance(f.base, sympy.tanh) and _near_cancellation(constant, coeff):
                # c + k*tanh(u)**2 == (c + k) - k/cosh(u)**2 where c + k is small next to k:
                # the log-determinant of SAC's tanh squashing, log(1 - tanh(x)**2 + 1e-6),
                # was 3.4e-3 off in float32 from |x| = 10, where tanh(x)**2 rounds to 1
                return remainder + (constant + coeff) - coeff * sympy.cosh(f.base.args[0]) ** -2
            if f.is_Pow and f.exp == -1 and isinstance(f.base, sympy.tanh) and same_number(constant, -coeff):
                # c*(1/tanh(u) - 1) == 2*c/expm1(2u): rounded to 0 in float32 from u = 9
                # (coth's derivative written with exponentials; a fourth accuracy hunt)
                return remainder + 2 * coeff / expm1(_expand(2 * f.base.args[0]))
            if f.is_Pow and f.exp == -1 and isinstance(f.base, sympy.tanh) and same_number(constant, coeff):
                return remainder - 2 * coeff / expm1(_expand(-2 * f.base.args[0]))  # c*(1/tanh(u) + 1)
        if isinstance(f, softplus):
            u = f.args[0]
            half = _expand(-u / 2)
            # (Not of a v with |.|: log(cosh(v))'s own form above |v| = 1, _log_cosh, where it
            # does not cancel; 2*|x| for log(cosh(2*x)) nested it 5 deep, found in review.)
            if not half.has(sympy.Abs) and coeff * half in terms and -coeff * _LOG2 in terms:
                # v + softplus(-2v) - log(2) == log(cosh(v)), whose own form does not cancel
                # near 0: torch's TanhTransform log-determinant 2*(log(2) - x - softplus(-2x))
                # was 0 in float32 at x = 1e-4 (a fourth accuracy hunt)
                return rest - coeff * half + coeff * _LOG2 + coeff * sympy.log(sympy.cosh(half))
            others = rest + coeff * u  # softplus(u) == u + softplus(-u); like terms cancel
            if _size(others) < _size(rest):
                return others + coeff * softplus(_expand(-u))
            partner = -coeff * softplus(_expand(-u))  # softplus(u) - softplus(-u) == u (0 - 0 near 0)
            if partner in terms:
                return rest - partner + coeff * u
        if isinstance(f, logaddexp):  # logaddexp(a, b) - a == softplus(b - a) (accuracy hunt)
            a, b = f.args
            if _expand(a + b) == 0 and not a.has(sympy.Abs) and -coeff * _LOG2 in terms:  # logaddexp(v, -v) - log(2)
                return rest + coeff * _LOG2 + coeff * sympy.log(sympy.cosh(a))
            for a, b in (f.args, f.args[::-1]):
                # (Not for a b that is a logaddexp itself: b - a would cancel as the sum did,
                # where _rule_exp_lse subtracts a inside it; 3-input softmax, found in review.)
                if -coeff * a in terms and not b.has(logaddexp):
                    return rest + coeff * a + coeff * softplus(_expand(b - a))
        for factor in sympy.Mul.make_args(term):
            if factor.is_Pow and factor.exp == -1 and isinstance(factor.base, sympy.tanh):
                # c*A/tanh(u) - c*A == 2*c*A/expm1(2u) (and + c*A, -2*c*A/expm1(-2u)): the
                # two terms cancel where tanh(u) rounds to 1 (from u = 9 in float32), the
                # gradient of coth written with exponentials, as the rules distribute it (a
                # fourth accuracy hunt)
                u, without = factor.base.args[0], term / factor
                if -without in terms:
                    return rest + without + 2 * without / expm1(_expand(2 * u))
                if without in terms:
                    return rest - without - 2 * without / expm1(_expand(-2 * u))
        if isinstance(f, sigmoid):  # sigmoid(u) + sigmoid(-u) == 1
            partner = coeff * sigmoid(_expand(-f.args[0]))
            if partner in terms:
                return rest - partner + coeff
            if -partner in terms:
                # sigmoid(u) - sigmoid(-u) == tanh(u/2), which does not cancel near 0: the
                # logistic log density log(sigmoid(x)) + log(sigmoid(-x))'s gradient was 0
                # in float32 at x = 1e-8 (a fourth accuracy hunt)
                return rest + partner + coeff * sympy.tanh(f.args[0] / 2)
    return None


def _rule_large_part(node: sympy.Expr):
    """Sums where softplus(u)'s or sigmoid(u)'s large part cancels against other inputs.

    BCE with logits, ``x - x*t + log(1 + exp(-x))``, is ``softplus(x) - t*x`` after the
    rules above: at the hard label t = 1 the loss is softplus(-x), 4e-8 at x = 17, but
    softplus(x) rounds to x in float32 there and the difference is 0 (8.3e-3 off at
    x = 10); its gradient sigmoid(x) - t rounds the same way (both found by an accuracy
    hunt). F.binary_cross_entropy_with_logits splits off max(x, 0) for the same reason.

    - ``c*softplus(u) + k*u`` (k free of u's symbols) -> ``where(u > 0, (c + k)*u, k*u) +
      c*softplus(-|u|)``: softplus(u) is max(u, 0) + softplus(-|u|), and the linear parts
      meet in one term, so they cancel exactly before the small part is added.
    - ``c*sigmoid(u) + r`` (r free of u's symbols, not a number) -> ``where(u > 0, c + r, r)
      + where(u > 0, -s, s)`` with s = c*sigmoid(-|u|): sigmoid(u) is 1 - sigmoid(-u) for u > 0.
    - ``c*Max(u, 0) + k*u`` (k free of u's symbols, not a number) -> ``where(u > 0, (c + k)*u,
      k*u)``: the hand-written BCE with logits, ``Max(x, 0) - x*t + log(1 + exp(-abs(x)))``,
      was 3.5% off at x = 20 with the soft label t = 0.999999 in float32, where ``x - x*t``
      cancels and ``x*(1 - t)`` is exact (a fifth accuracy hunt).

    Each part is one node, so the printed sum cannot add the small part first. -|u| is
    where(u > 0, -u, u), not -abs(u): autograd differentiates a backward formula under
    create_graph=True, and abs's derivative at 0 is 0. (softplus and sigmoid of a u <= 0
    have no large part; -|u| is such, so the rule does not match its own output.)
    """
    if not node.is_Add:
        return None
    for term in node.args:
        coeff, f = term.as_coeff_Mul()
        if not isinstance(f, (softplus, sigmoid)) and _positive_part(f) is None:
            continue
        u = f.args[0] if isinstance(f, (softplus, sigmoid)) else _positive_part(f)
        if u.is_nonpositive or _is_minus_abs(u) or not u.free_symbols:
            continue
        rest = sympy.Add.make_args(node - term)
        positive = u > 0
        if isinstance(f, sympy.Max):
            linear = [t for t in rest if t.free_symbols and not (t / u).free_symbols & u.free_symbols]
            slope = sympy.Add(*(t / u for t in linear))
            if not slope.free_symbols:
                continue  # (x - 0.999*x folds the numbers exactly: nothing cancels)
            others = [t for t in rest if t not in linear]
            return sympy.Add(*others, sympy.Piecewise(((coeff + slope) * u, positive), (slope * u, True)))
        if isinstance(f, softplus):
            linear = [t for t in rest if t.free_symbols and not (t / u).free_symbols & u.free_symbols]
            slope = sympy.Add(*(t / u for t in linear))
            if not slope.free_symbols:
                continue  # softplus(u) - u is _rule_add's; a numeric slope cancels nothing
            large = sympy.Piecewise(((coeff + slope) * u, positive), (slope * u, True))
            others = [t for t in rest if t not in linear]
            return sympy.Add(*others, large, coeff * softplus(_minus_abs(u)))
        free = [t for t in rest if not t.free_symbols & u.free_symbols]
        offset = sympy.Add(*free)
        if not offset.free_symbols:
            continue  # c + c*sigmoid(u) and the like are _rule_add's
        large = sympy.Piecewise((coeff + offset, positive), (offset, True))
        small = coeff * sigmoid(_minus_abs(u))
        others = [t for t in rest if t not in free]
        return sympy.Add(*others, large, sympy.Piecewise((-small, positive), (small, True)))
    return None


def _positive_part(f: sympy.Expr) -> sympy.Expr | None:
    """``u`` where ``f`` is Max(u, 0), else None."""
    if isinstance(f, sympy.Max) and len(f.args) == 2 and sympy.S.Zero in f.args:
        return f.args[1] if f.args[0] == 0 else f.args[0]
    return None


def _minus_abs(u: sympy.Expr) -> sympy.Expr:
    """-|u| as where(u > 0, -u, u) (see _rule_large_part for why not abs)."""
    return sympy.Piecewise((-u, u > 0), (u, True))


def _is_minus_abs(u: sympy.Expr) -> bool:
    return isinstance(u, sympy.Piecewise) and len(u.args) == 2 and u.args[0][0] == -u.args[1][0]


def _square_root(term: sympy.Expr):
    """``q`` with ``q**2 == term``, for a positive number or an even power; else None."""
    coeff, rest = term.as_coeff_Mul()
    if not (_number(coeff) and coeff.is_positive):
        return None
    root = sympy.sqrt(coeff)
    if rest == 1:
        return root
    powers = sympy.Mul.make_args(rest)
    out = [root]
    for p in powers:
        if p.is_Pow and p.exp.is_Integer and p.exp % 2 == 0 and p.base.is_extended_real:
            out.append(p.base ** (p.exp // 2))
        else:
            return None
    return sympy.Mul(*out)


def _rule_hypot(node: sympy.Expr):
    if not (node.is_Pow and node.base.is_Add and _number(node.exp)):
        return None
    twice = 2 * node.exp
    if twice.is_Float and float(twice).is_integer():  # (a Float is never == an Integer)
        twice = sympy.Integer(int(twice))  # (x**2 + 1)**0.5 is sqrt(x**2 + 1) (found in review)
    if twice.is_Integer and twice % 2 == 0:
        return None  # an integer power of a sum of squares is a polynomial
    roots = [_square_root(t) for t in node.base.args]
    if any(r is None for r in roots) or sum(1 for r in roots if not r.is_number) == 0:
        return None
    roots.sort(key=hypot_order)
    total = roots[0]
    for r in roots[1:]:
        total = hypot(total, r)
    return total**twice


def _rule_root_excess(node: sympy.Expr):
    """``k*sqrt(A) - k*c`` -> ``k*(A - c**2)/(sqrt(A) + c)`` for a positive number ``c``
    where ``A - c**2`` is no larger than ``A``: ``sqrt(1 + x) - 1`` is ``x/(sqrt(1 + x) + 1)``,
    which keeps the small part near x = 0 that the difference rounds away (found by an
    accuracy hunt). The denominator adds two positive numbers, so it cannot cancel. (A sum
    of squares is left to hypot_excess, which does not overflow.)"""
    if not node.is_Add:
        return None
    terms = list(node.args)
    for term in terms:
        scale, root = term.as_coeff_Mul()
        if not (root.is_Pow and root.exp == sympy.S.Half and root.base.is_Add):
            continue
        if root.base.has(sympy.exp, expm1, sympy.cosh, sympy.sinh, sympy.gamma):
            # A that overflows makes the quotient inf/inf = nan where the difference was inf
            # (sqrt(exp(x) + 3) - 1 at x = 100 in float32; found in review)
            continue
        for minus_c in (t / scale for t in terms if t.is_number and t is not term):
            if not (-minus_c).is_positive:
                continue
            smaller = _expand(root.base - minus_c**2)
            if _size(smaller) <= _size(root.base):
                rest = [t for t in terms if t is not term and t != minus_c * scale]
                return sympy.Add(*rest, scale * smaller / (root - minus_c))
    return None


_QUOTIENT_MAX_DEGREE = 8  # the most terms of _power_difference_quotient's sum


def _power_difference_quotient(a: sympy.Expr, b: sympy.Expr, p: int) -> sympy.Expr:
    """``(a**p - b**p)/(a - b)`` for an integer ``p >= 1``, the sum of ``a**j*b**(p-1-j)``,
    by Horner's scheme in ``a``; for an even ``p``, ``(a + b)`` times the same sum in
    ``a**2``, which leaves even powers of ``a`` only."""
    if p % 2 == 0:
        return (a + b) * _power_difference_quotient(a**2, b**2, p // 2)
    total = sympy.S.One
    for j in range(1, p):
        total = total * a + b**j
    return total


def _rule_power_minus_value(node: sympy.Expr):
    """``k*A**p + c`` with ``c = -k*B**p`` for a number ``B`` and ``A - B`` a ``D`` that
    does not cancel: ``A = B + u`` (``D = u``), or ``A = hypot(u, B)`` (``D =
    hypot_excess(u, B)``; ``(B**2 + u**2)**(p/2)`` as the rules write it, which does not
    overflow where u**2 would). As written the power rounds to ``B**p`` near ``D = 0`` and
    the difference to 0: Barron's robust loss ``c*((1 + x**2/b)**p - 1)`` was 0 in float32 at
    x = 1e-4, and Tukey's biweight ``1 - (1 - x**2)**3`` 3x off there (a fourth accuracy
    hunt).

    - A positive integer ``p`` (up to _QUOTIENT_MAX_DEGREE, 8; a Float such as 3.0 too) ->
      ``k*D*S``, ``S = A**(p-1) + A**(p-2)*B + ... + B**(p-1)`` by Horner's scheme
      (``A**p - B**p = (A - B)*S``), with ``A + B`` taken out for an even ``p``, which
      leaves even powers of ``A``: no term cancels where ``A`` and ``B`` have one sign, nor
      anywhere for an even ``p``; for an odd one, where they do not, the sum loses at most
      p ulps. (The binomial ``u*Q(u)`` cancelled for ``|u|`` beyond ``|B|``: ``(1 + x)**8 - 1``
      was 2.6e-2 off at x = -2.001 in float32; an exponent 3.0 took the expm1 form, nan
      where ``A < 0``; both found in review.)
    - ``p = -1`` -> ``-(k/B)*(D/(B + D))``, a quotient without a where: ``c/(a + v) +
      k``, ``1/(1 + x) - 1`` (log(1 + x) - x's gradient) and ``1/(1 + x**2) - 1`` (atan's
      derivative minus 1).
    - In the forward's formulas (stabilize's root_sums), ``p = j + m/q`` (``0 < m < q``,
      ``q`` 2 or 4, ``j`` up to 8; for ``p > 0`` a ``D`` that cannot overflow to +inf) or
      ``p = -m/q``, for ``B > 0`` -> sums of positive terms in the roots ``r = A**(1/q)``
      and ``s = B**(1/q)`` (_root_power_difference): no where, and no term cancels
      (power_excess's where took Barron's loss from 8.1 to 13.5-16.5 ms a forward plus
      backward at 1e6 float32, where eager autograd took 9.7).
    - There too, ``p < -1`` for ``B > 0``, an integer down to -8 or ``-(j + m/q)`` as
      above -> the same sums of the reciprocals ``1/A`` and ``1/B``, whose difference is
      ``-(D/A)/B`` (_reciprocal_power_difference): each term is a power of ``1/A``, small
      where ``A`` is large. (Not ``-D*S/(A**n*B**n)``: inf/inf where ``A**n`` overflows.)
    - Any other ``p``, and any in a derivative formula, for ``B > 0`` or an integer ``p``
      -> ``k*power_excess(D, B, p)``: ``expm1(p*log1p(D/B))`` near 0, as written far from
      it.

    (After the rules that have forms of their own: a square root's minus a number is
    _rule_root_excess's.)"""
    if not node.is_Add:
        return None
    constant, rest = node.as_coeff_Add()
    if constant == 0 or not _number(constant):
        return None
    for term in sympy.Add.make_args(rest):
        k, power = term.as_coeff_Mul()
        if not (power.is_Pow and _number(power.exp)):
            continue
        difference = _power_difference(power.base)
        if difference is None:
            continue
        b, excess = difference
        p = _integer_if_whole(power.exp)
        if not same_number(k * b**p, -constant):
            continue
        others = node - constant - term
        if p.is_Integer and 0 < p <= _QUOTIENT_MAX_DEGREE:
            return others + k * excess * _power_difference_quotient(power.base, b, int(p))
        if p == -1:
            # A**-1 - 1/B == -(D/A)/B, without a where (power_excess's took 3-4x the time of
            # the difference as written at 1e6 float32, most of it two torch.where): log(1 +
            # x) - x's gradient 1/(1 + x) - 1 was 0 in float32 at x = 1e-8 (a fourth accuracy
            # hunt). Its own derivative cancels at large D, which has_offset_quotient sees.
            # (D/A as _excess_over_base writes it; for an affine D, the number times D first,
            # as SymPy spreads it into the sum.)
            if _affine(excess):
                return others + constant * excess / power.base  # (constant == -k/B)
            return others - (k / b) * _excess_over_base(b, excess)
        if _ROOT_SUMS.get() and b.is_positive and (p < 0 or _bounded_above(excess)):
            roots = _root_power_difference(power.base, b, excess, p)
            if roots is not None:
                return others + k * roots
        if _ROOT_SUMS.get() and p < -1 and b.is_positive:
            reciprocal = _reciprocal_power_difference(power.base, b, excess, -p)
            if reciprocal is not None:
                return others + k * reciprocal
        if b.is_positive or p.is_Integer:
            return others + k * power_excess(excess, b, p)
    return None


# Square and fourth roots: one sqrt or pow each, of an exponent a float holds. (Not cube
# roots: pow(A, 0.3333333333333333) is ln(A)*1.8e-17 off relative, which the sums
# multiplied, 11 float64 ulps for (1 + x)**(-2/3) - 1 at x = 1e10 against 0.3 as written;
# found in review.)
_ROOT_DENOMINATORS = (2, 4)


def _root_power_difference(a: sympy.Expr, b: sympy.Expr, excess: sympy.Expr, p: sympy.Expr) -> sympy.Expr | None:
    """``a**p - b**p`` for a number ``b > 0`` and ``excess = a - b``, as sums of positive
    terms in the roots ``r = a**(1/q)`` and ``s = b**(1/q)``, where ``p`` is ``j + m/q``
    (``0 < m < q``, ``q`` 2 or 4, ``0 <= j <= 8``) or ``-m/q``; else None.

    ``r - s = excess/(r**(q-1) + r**(q-2)*s + ... + s**(q-1))``, a quotient of terms of one
    sign (kept whole, norm_ratio, so that ``excess`` is not multiplied first and overflows),
    and then, by _power_difference_quotient's sums of positive terms:

    - ``a**p - b**p = a**j*(r - s)*S_m(r, s) + s**m*excess*S_j(a, b)``;
    - ``a**(-m/q) - b**(-m/q) = -((r - s)*S_m(r, s)/r**m)/s**m``, the quotient by ``r**m``
      kept whole too, at most ``1 - (s/r)**m`` in size: a factor outside it would otherwise
      multiply ``excess`` first (``x*((1 + x)**-0.5 - 1)`` was -inf in float32 from x =
      5e25; found in review). Where ``excess`` can overflow, it and ``a`` are taken finite
      (stable_functions.finite): the value tends to ``-b**p`` there, and the quotient
      ``inf/inf`` was nan.

    Each loses a few ulps of the value at most, near ``a = b`` and far from it, without
    power_excess's where. (Not for ``p <= -1``: ``a**|p|`` would overflow where the value
    is only small; _reciprocal_power_difference's.) A Float exponent is read exactly (0.25
    is 1/4, 7.5 is 15/2), and a Float ``b`` too, so that its roots are rounded once.
    """
    parts = _fraction_parts(p)
    if parts is None or p <= -1:
        return None
    whole, m, q = parts
    if p < 0:
        a, excess = _finite_where_it_overflows(a, excess)
    r, s, root_difference = _roots(a, b, excess, q)
    if p < 0:
        fraction = root_difference * _power_difference_quotient(r, s, m)
        return -norm_ratio(fraction, r**m) / s**m
    return _root_sums(a, b, excess, whole, m, r, s, root_difference)


def _roots(a: sympy.Expr, b: sympy.Expr, excess: sympy.Expr, q: int) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """The ``q``-th roots ``r`` of ``a`` and ``s`` of ``b``, and ``r - s``, as
    ``excess/(r**(q-1) + ... + s**(q-1))`` kept whole (norm_ratio)."""
    r, s = a ** sympy.Rational(1, q), _number_power(b, sympy.Rational(1, q))
    return r, s, norm_ratio(excess, _power_difference_quotient(r, s, q))


def _fraction_parts(p: sympy.Expr) -> tuple[int, int, int] | None:
    """``(j, m, q)`` with ``|p| = j + m/q``, ``0 < m < q``, for a ``q`` in
    _ROOT_DENOMINATORS and ``j`` up to _QUOTIENT_MAX_DEGREE; else None."""
    rational = sympy.Rational(p)
    if rational.q not in _ROOT_DENOMINATORS:
        return None
    whole, m = divmod(abs(rational.p), rational.q)
    return None if whole > _QUOTIENT_MAX_DEGREE else (whole, m, rational.q)


def _root_sums(a, b, excess, whole: int, m: int, r, s, root_difference) -> sympy.Expr:
    """``a**(j + m/q) - b**(j + m/q) = a**j*(r - s)*S_m(r, s) + s**m*excess*S_j(a, b)``
    for the roots ``r`` and ``s`` of ``a`` and ``b`` and their difference."""
    fraction = root_difference * _power_difference_quotient(r, s, m)
    if whole == 0:
        return fraction
    return a**whole * fraction + s**m * excess * _power_difference_quotient(a, b, whole)


def _number_power(number: sympy.Expr, exponent: sympy.Rational) -> sympy.Expr:
    """``number**exponent`` (a root, or the reciprocal); of a Float, from the Rational it
    holds, at 30 digits, so that it is rounded once when printed (SymPy evaluates
    ``Float(1e6)**(1/3)`` at 15 digits, printed 99.99999999999997; found in review), and
    a number, not a quotient of big integers that SymPy pulls out of the sums (0.3's
    reciprocal's made a coefficient 2.9e-47, 0 in float32: nan at every x for
    ``(0.3 + x)**-4.25 - 0.3**-4.25``; found in a second review)."""
    if number.is_Float:
        return (sympy.Rational(number) ** exponent).evalf(30)
    return number**exponent


def _cannot_overflow(excess: sympy.Expr) -> bool:
    """Whether ``excess`` is finite wherever the inputs are: hypot's excess, or one input
    times a number at most 1 in size (``3*x - 2*y`` overflows from x = 1.1e38 in float32)."""
    if isinstance(excess, hypot_excess):
        return True
    scale, rest = excess.as_coeff_Mul()
    return rest.is_Symbol and abs(scale) <= 1


def _excess_over_base(b: sympy.Expr, excess: sympy.Expr) -> sympy.Expr:
    """``excess/a`` for the base ``a = b + excess``, kept whole (norm_ratio), so that no factor
    multiplies ``excess`` first and overflows it (``3/(2 + x**2) - 3/2``), and finite where
    ``excess`` overflows: one that can is taken finite, as ``b + excess`` is, so that the
    quotient is 1 there, not inf/inf. (``b + excess`` as written, not ``b + finite(excess)``:
    the difference-of-squares pass factors it, exact near its root, ``1/(1 - x**2) - 1``
    near x = 1, found in review; and in float16 ``16 + 65504`` would round to inf.)"""
    base, excess = _finite_where_it_overflows(b + excess, excess)
    return norm_ratio(excess, base)


def _finite_where_it_overflows(*values: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """``values`` (the last of them an excess) as they are where the excess cannot
    overflow (_cannot_overflow), else each taken finite (stable_functions.finite)."""
    if _cannot_overflow(values[-1]):
        return values
    return tuple(finite(v) for v in values)


def _reciprocal_power_difference(
    a: sympy.Expr, b: sympy.Expr, excess: sympy.Expr, power: sympy.Expr
) -> sympy.Expr | None:
    """``a**-power - b**-power`` for ``power > 1`` and a number ``b > 0``, as ``a'**power -
    b'**power`` of the reciprocals ``a' = 1/a`` and ``b' = 1/b``, whose difference is
    ``-(excess/a)/b``: for an integer ``power`` up to 8, ``(a' - b')*S(a', b')``
    (_power_difference_quotient), for ``j + m/q``, _root_power_difference's sums. Every
    term is a power of ``1/a``, small where ``a`` is large: as
    ``-(a**n - b**n)/(a**n*b**n)`` it was inf/inf where ``a**n`` overflows, so
    power_excess's where took these (Barron's loss with alpha = -4,
    ``(1 + x**2/6)**-2 - 1``); else None."""
    power = _integer_if_whole(power)
    smaller, smaller_b = 1 / a, _number_power(b, sympy.S.NegativeOne)
    difference = -_excess_over_base(b, excess) * smaller_b
    if power.is_Integer:
        if power > _QUOTIENT_MAX_DEGREE:
            return None
        return difference * _power_difference_quotient(smaller, smaller_b, int(power))
    parts = _fraction_parts(power)
    if parts is None:
        return None
    whole, m, q = parts
    # 1/r - 1/s from the roots of a, -((r - s)/r)/s: at a = 0 it is inf, where the root of
    # 1/a, inf, would make the quotient inf/inf (found in a second review)
    a, excess = _finite_where_it_overflows(a, excess)
    r, s, root_difference = _roots(a, b, excess, q)
    return _root_sums(smaller, smaller_b, difference, whole, m, 1 / r, 1 / s, -norm_ratio(root_difference, r) / s)


def _bounded_above(excess: sympy.Expr) -> bool:
    """Whether ``excess`` stays finite where the inputs are, or can only overflow to -inf:
    for ``p > 0`` a root of ``b + excess`` is inf/inf where it overflows to +inf, where the
    difference as written was inf (taken finite, it would be a wrong finite number: the
    value grows with ``excess``; ``3*x - 2*y`` overflows from x = 1.1e38 in float32, found
    in review)."""
    return _cannot_overflow(excess) or bool(excess.is_nonpositive)


def _integer_if_whole(p: sympy.Expr) -> sympy.Expr:
    """``p`` as an Integer where it is a Float of integer value (``x**3.0``)."""
    if p.is_Float and sympy.Rational(p).q == 1:  # (SymPy's Float(3.0) != 3)
        return sympy.Integer(sympy.Rational(p))
    return p


def _power_difference(base: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``(B, base - B)`` for a base ``B + u`` with a nonzero number B, or ``hypot(u, B)``
    with a positive number B (the difference is hypot_excess(u, B)); else None."""
    if isinstance(base, hypot):
        numbers = [b for b in base.args if b.is_number and b.is_positive]
        if not numbers:
            return None
        b = numbers[0]
        (u,) = [v for v in base.args if v is not b] or [b]
        return b, hypot_excess(u, b)
    if base.is_Add:
        b, u = base.as_coeff_Add()
        if b != 0 and _number(b):
            return b, u
    return None


def _rule_hypot_excess(node: sympy.Expr):
    """``k*hypot(a, b) - k*b`` -> ``k*hypot_excess(a, b)`` for a positive number ``b``: the
    pseudo-Huber loss ``sqrt(1 + x**2) - 1``.

    (Not for a ``b`` of either sign: for b < 0 the difference does not cancel, and the
    quotient's denominator does. Nor for an expression that is positive in exact arithmetic,
    such as 1/cosh(y): it can round to 0, and then a = 0 gives 0/0 where the difference was
    0; found in review.)
    """
    if not node.is_Add:
        return None
    terms = list(node.args)
    for term in terms:
        factors = sympy.Mul.make_args(term)
        calls = [f for f in factors if isinstance(f, hypot)]
        if len(calls) != 1:
            continue
        scale = sympy.Mul(*(f for f in factors if f is not calls[0]))
        for a, b in (calls[0].args, calls[0].args[::-1]):
            if not (b.is_number and b.is_positive) or not a.free_symbols:
                continue
            partner = -scale * b
            if partner in terms:
                rest = [t for t in terms if t is not term and t != partner]
                return sympy.Add(*rest, scale * hypot_excess(a, b))
    return None


def _norm_components(norm: hypot) -> list[sympy.Expr]:
    """The non-number parts of a (nested) hypot's arguments: x and y for
    hypot(hypot(x, 2*y), 1)."""
    components: list[sympy.Expr] = []
    for arg in norm.args:
        parts = _norm_components(arg) if isinstance(arg, hypot) else [arg.as_coeff_Mul()[1]]
        components += [p for p in parts if not p.is_number and p not in components]
    return components


_NORM_MAX_TERMS = 8  # a sum of more monomials is not divided into a norm's power


def _monomial_degree(term: sympy.Expr, names: set[sympy.Dummy]) -> int | None:
    """The degree of ``term`` if it is a number times powers of ``names``, else None."""
    coefficient, rest = term.as_coeff_Mul()
    degree = 0
    for factor in sympy.Mul.make_args(rest):
        base, exponent = factor.as_base_exp()
        if not (base in names and exponent.is_Integer and exponent > 0):
            return None
        degree += int(exponent)
    return degree if coefficient.is_number else None


def _homogeneous_degree(factor: sympy.Expr, names: set[sympy.Dummy]) -> int:
    """The degree of ``factor`` if it is a sum of at most _NORM_MAX_TERMS monomials in
    ``names`` of one positive degree, else 0. (Written out as it stands: a power of a sum is
    not expanded, which could make thousands of terms.)"""
    terms = sympy.Add.make_args(factor)
    if len(terms) > _NORM_MAX_TERMS:
        return 0
    degrees = {_monomial_degree(t, names) for t in terms}
    if len(degrees) != 1 or None in degrees:
        return 0  # (not a polynomial in names, or not homogeneous)
    return degrees.pop()


def _rule_norm_ratio(node: sympy.Expr):
    """``f(a, b)*hypot(a, b)**-n`` -> ``f(a/h, b/h)*h**(d - n)`` (h = hypot(a, b)) for a
    homogeneous polynomial ``f`` of degree ``d <= n``, n >= 2, with the quotients kept
    whole (norm_ratio): hypot's second derivatives, ``b**2/hypot(a, b)**3`` and the like,
    are 0 in float32 where the norm passes 7e12 (its cube overflows), and inf or 0*inf =
    nan where it is below 1.4e-13 (its cube underflows), while ``(b/h)**2/h`` is exact
    there."""
    if not node.is_Mul:
        return None
    power = next((f for f in node.args if isinstance(f.as_base_exp()[0], hypot)), None)
    if power is None:
        return None
    norm, exponent = power.as_base_exp()
    components = _norm_components(norm)
    if not (exponent.is_Integer and exponent <= -2 and components):
        return None
    # Each component stands for itself, so that (y - 1)**2 is a square of y - 1.
    names = {c: sympy.Dummy(real=True) for c in components}
    ratios = {names[c]: norm_ratio(c, norm) for c in components}
    named = {f: f.xreplace(names) for f in node.args if f is not power}
    degrees = {f: _homogeneous_degree(named[f], set(ratios)) for f in named}
    degree, factors = 0, []
    # the highest degrees first, so that as little of the norm's power as possible is left
    for factor in sorted(named, key=lambda f: -degrees[f]):
        if degrees[factor] and degree + degrees[factor] <= -exponent:
            degree += degrees[factor]
            factors.append(named[factor].xreplace(ratios))
        else:
            factors.append(factor)
    if not degree:
        return None
    return sympy.Mul(*factors, norm ** (exponent + degree))


_OVERFLOWING = (sympy.exp, expm1, sympy.cosh, sympy.sinh, sympy.tan, sympy.gamma)


def _can_overflow(expr: sympy.Expr) -> bool:
    """Whether ``expr`` may be inf where it is not taken: an exp-like function. (Not any
    negative power: 1/(1 + Max(x, 0)) in the gradient of log(1 + Max(x, 0)) cannot be inf,
    and the Piecewise's guards made its backward 6x slower; found in review. A quotient
    that is inf only where its denominator is exactly 0 makes nan at that point alone.)"""
    return expr.has(*_OVERFLOWING)


def _rule_heaviside_mask(node: sympy.Expr):
    """``Heaviside(u)*f`` -> ``Piecewise((Heaviside(u)*f, u >= 0), (0, True))`` where ``f``
    may overflow: printed as ``0.5*(sign(u) + 1)*f`` it is 0*inf = nan where u < 0 and f
    overflows. The derivative of Min(0, u) holds Heaviside(-u)*u': ELU written with Max and
    Min, ``Max(x, 0) + Min(0, exp(x) - 1)``, had a nan gradient from x = 89 in float32, as
    autograd's has (found by an accuracy hunt); as a Piecewise the untaken branch is cut
    off (_guard_piecewise)."""
    if not node.is_Mul:
        return None
    step = next((f for f in node.args if isinstance(f, sympy.Heaviside) and f.args[1] == sympy.S.Half), None)
    if step is None:
        return None
    rest = sympy.Mul(*(f for f in node.args if f is not step))
    if not _can_overflow(rest):
        return None
    # One condition: the step stays inside, where it is 1, or 1/2 at 0, written as it prints
    # (0.5*(sign(u) + 1)) so that this rule does not take it again.
    u = step.args[0]
    return sympy.Piecewise((rest * (sympy.sign(u) + 1) / 2, u >= 0), (0, True))


def _rule_xlogy(node: sympy.Expr):
    """``u*log(b)**k`` -> ``xlogy(...xlogy(u, b)..., b)`` (k times, k a positive integer): 0
    where u is 0, as the mathematics is wherever u vanishes faster than the log grows. A
    power of the log comes from differentiating b**y by y twice: --save speed's d2/dy2 of
    Max(x, 0)**y, b**y*log(b)**2, was 0*inf = nan at every x < 0 (found next to fuzz
    campaign 4132's finds)."""
    if not node.is_Mul:
        return None
    factors = sympy.Mul.make_args(node)
    logs = [f for f in factors if isinstance(f.as_base_exp()[0], sympy.log) and _positive_integer(f.as_base_exp()[1])]
    if len(logs) != 1 or not logs[0].as_base_exp()[0].args[0].free_symbols:
        # log of a constant is a constant factor: nothing for xlogy to guard, and SymPy may
        # have folded 200*log(10) into log(10**200), an int beyond float range (found by the
        # fuzz campaign)
        return None
    coeff, rest = sympy.Mul(*(f for f in factors if f is not logs[0])).as_coeff_Mul()
    if not rest.free_symbols:
        return None
    log, power = logs[0].as_base_exp()
    for _ in range(int(power)):
        rest = xlogy(rest, log.args[0])
    return coeff * rest


def _positive_integer(value: sympy.Expr) -> bool:
    return bool(value.is_Integer and value > 0)


def _rule_xlogy_absorbs(node: sympy.Expr):
    """``(xlogy(c, b) + r)*F`` -> ``xlogy(c*F, b) + r*F`` where ``F`` holds a power of
    ``b``: xlogy is then 0 where F is (b = 0), as the product is in the limit. --save
    speed's d2/dxdy of Max(x, 0)**y, (1 + xlogy(y, b))*b**(y - 1), was -inf*0 = nan at
    every x < 0 (found next to fuzz campaign 4132's finds, as were the campaign's own
    (x > c)**e and Heaviside(x)**e)."""
    if not node.is_Mul:
        return None
    for sum_ in (f for f in node.args if f.is_Add):
        bases = {t.args[1] for term in sum_.args for t in sympy.Mul.make_args(term) if isinstance(t, xlogy)}
        rest = sympy.Mul(*(f for f in node.args if f is not sum_))
        for base in bases:
            if any(f.as_base_exp()[0] == base for f in sympy.Mul.make_args(rest)):
                return sympy.Add(*(_absorbed(term, rest, base) for term in sum_.args))
    return None


def _absorbed(term: sympy.Expr, factor: sympy.Expr, base: sympy.Expr) -> sympy.Expr:
    """``term*factor``, with ``factor`` inside ``term``'s xlogy of ``base`` if it has one."""
    factors = sympy.Mul.make_args(term)
    logs = [f for f in factors if isinstance(f, xlogy) and f.args[1] == base]
    if len(logs) != 1:
        return term * factor
    others = sympy.Mul(*(f for f in factors if f is not logs[0]))
    return xlogy(logs[0].args[0] * others * factor, base)


def _rule_same_base(node: sympy.Expr):
    """``b**e/b`` -> ``b**(e - 1)`` (SymPy keeps them apart for a symbolic ``e``): 0/0 =
    nan where b = 0 as written. Found next to fuzz campaign 4132's finds, in --save
    speed's d2/dxdy of Max(x, 0)**y."""
    if not node.is_Mul:
        return None
    bases = [f.as_base_exp()[0] for f in node.args if not f.is_number]
    if len(set(bases)) == len(bases):
        return None
    combined = sympy.powsimp(node, combine="exp")
    return combined if combined != node else None


def _rule_tanh_half(node: sympy.Expr):
    """``expm1(u)*sigmoid(-u)**k`` -> ``tanh(u/2)*sigmoid(-u)**(k - 1)``: tanh written with
    exponentials, (exp(2x) - 1)/(exp(2x) + 1), and the derivative of exp(x)/(1 + exp(x))**2
    are inf*0 = nan in float32 from x = 45 and x = 89 as the ratio rules leave them (found
    by an accuracy hunt)."""
    if not node.is_Mul:
        return None
    powers = dict(f.as_base_exp() for f in node.args)
    for f in node.args:
        if isinstance(f, expm1):
            partner = sigmoid(_expand(-f.args[0]))
            k = powers.get(partner)
            if k is not None and _number(k) and k >= 1:
                rest = [g for g in node.args if g is not f and g.as_base_exp()[0] != partner]
                return sympy.Mul(*rest, sympy.tanh(f.args[0] / 2), partner ** (k - 1))
    return None


def _rule_coth_half(node: sympy.Expr):
    """``(1 + exp(v))**k*expm1(v)**-k`` -> ``tanh(v/2)**-k``, and ``sigmoid(u)**k*
    sigmoid(-u)**-k`` -> ``exp(k*u)``: coth written with exponentials, (exp(2x) + 1)/(exp(2x)
    - 1), is inf/inf = nan in float32 from x = 45, and the logistic log density
    log(sigmoid(x)) + log(1 - sigmoid(x))'s gradient ``(1 - sigmoid(x)/sigmoid(-x))*
    sigmoid(-x)`` inf*0 from x = 89 (a fourth accuracy hunt)."""
    if not node.is_Mul:
        return None
    powers = dict(f.as_base_exp() for f in node.args)
    for base, k in powers.items():
        if not (_number(k) and k.is_nonzero):
            continue
        if base.is_Add and len(base.args) == 2 and 1 in base.args:
            (e,) = [t for t in base.args if t != 1]
            partner = expm1(e.args[0]) if isinstance(e, sympy.exp) else None
            made = sympy.tanh(e.args[0] / 2) ** -k if partner is not None else None
        elif isinstance(base, sigmoid):
            partner = sigmoid(_expand(-base.args[0]))
            made = sympy.exp(_expand(k * base.args[0]))
        else:
            continue
        if partner is not None and powers.get(partner) == -k:
            rest = [g for g in node.args if g.as_base_exp()[0] not in (base, partner)]
            return sympy.Mul(*rest, made)
    return None


def _rule_exp_over_expm1(node: sympy.Expr):
    """``exp(u)/expm1(u)**k`` -> ``-expm1(u)**(1 - k)/expm1(-u)``: exp(u)/(exp(u) - 1), the
    derivative of log(exp(x) - 1) (softplus's inverse) and part of x/(exp(x) - 1)'s, is
    inf/inf = nan from u = 89 in float32 as written, and 1/(1 - exp(-u)) is not (found by
    an accuracy hunt)."""
    if not node.is_Mul:
        return None
    powers = dict(f.as_base_exp() for f in node.args)
    for f in node.args:
        if isinstance(f, sympy.exp):
            partner = expm1(f.args[0])
            k = powers.get(partner)
            if k is not None and _number(k) and k <= -1:
                rest = [g for g in node.args if g is not f and g.as_base_exp()[0] != partner]
                return -sympy.Mul(*rest, partner ** (k + 1)) / expm1(_expand(-f.args[0]))
    return None


def _rule_exp_over_positive_expm1(node: sympy.Expr):
    """``exp(a)*expm1(u)**-k`` for a positive ``u`` that can overflow -> ``exp(a - k*u)*
    (-expm1(-u))**-k``: the gradient of the complementary log-log link log(1 - exp(-exp(x))),
    ``exp(x)/expm1(exp(x))``, was inf/inf = nan from x = 89 in float32 (710 in float64),
    where it is 0; now ``exp(x - exp(x))/(-expm1(-exp(x)))``. For a positive ``u`` the new
    denominator lies between ``u/(1 + u)`` and 1, so only the exponent can leave the range,
    where the value does. (_rule_exp_over_expm1 takes ``exp(u)`` itself, for ``u`` of
    either sign.)"""
    if not node.is_Mul:
        return None
    exps = [f for f in node.args if isinstance(f, sympy.exp)]
    if len(exps) != 1:
        return None  # none to absorb, or _rule_merge_exp has yet to join them
    for f in node.args:
        base, k = f.as_base_exp()
        if not (isinstance(base, expm1) and _number(k) and k.is_negative):
            continue
        u = base.args[0]
        if u.is_positive and _can_overflow(u):
            rest = [g for g in node.args if g is not f and g is not exps[0]]
            return sympy.Mul(*rest) * sympy.exp(_expand(exps[0].args[0] + k * u)) * (-expm1(_expand(-u))) ** k
    return None


def _rule_exp_difference_ratio(node: sympy.Expr):
    """``exp(c)*(p*exp(a) - p*exp(b))**-k`` -> ``exp(c - k*a)*(-p*expm1(b - a))**-k`` where
    ``c - k*a`` is 0 or ``b - a``: the derivatives of log(exp(x) - exp(y)),
    ``exp(x)/(exp(x) - exp(y))`` and its y twin, are inf/inf = nan where the exps overflow
    (x = 89 in float32) and 0/0 where they underflow, while the log itself is ``x +
    log1mexp(y - x)`` (_rule_log). Then the quotient is bounded on both sides of a = b, and
    _rule_exp_over_expm1 takes an ``exp(b - a)`` left over. (Other exponents would overflow
    where b > a: ``exp(2*y)/(exp(x) - exp(y))**2`` was nan at (-100, 0) that way, found in
    review.)"""
    if not node.is_Mul or not any(isinstance(f, sympy.exp) for f in node.args):
        return None
    exponent = sympy.Add(*(f.args[0] for f in node.args if isinstance(f, sympy.exp)))
    for f in node.args:
        base, k = f.as_base_exp()
        difference = _exp_difference(base) if k.is_number and k.is_negative else None
        if difference is None:
            continue
        p, a, b = difference
        left = _expand(exponent + k * a)
        if left == 0 or _expand(left - b + a) == 0:
            rest = sympy.Mul(*(g for g in node.args if g is not f and not isinstance(g, sympy.exp)))
            return rest * sympy.exp(left) * (-p * expm1(_expand(b - a))) ** k
    return None


def _rule_sinh_over_cosh(node: sympy.Expr):
    """``sinh(u)**a*cosh(u)**-b`` -> ``tanh(u)**k*sinh(u)**(a - k)*cosh(u)**(k - b)``, with
    k = min(a, b): sinh(x/2)/cosh(x/2)**3, sigmoid's second derivative as SymPy simplifies
    it, is inf/inf = nan from x = 179 in float32, where tanh(x/2)/cosh(x/2)**2 is 0 (found
    by a double-backward survey); so was the gradient of 1/cosh(x)**2, -2*sinh(x)/cosh(x)**3,
    from |x| = 90 (found in review). The other way round, ``cosh(u)**a*sinh(u)**-b`` ->
    ``tanh(u)**-k*...``: the Langevin function coth(x) - 1/x's second derivative,
    2*cosh(x)/sinh(x)**3 - 2/x**3, was nan from |x| = 90 in float32 (found by an accuracy
    hunt), where autograd differentiating 1/tanh(x) is finite."""
    if not node.is_Mul:
        return None
    powers = dict(f.as_base_exp() for f in node.args)
    for base, a in powers.items():
        if isinstance(base, (sympy.sinh, sympy.cosh)) and a.is_Integer and a > 0:
            partner = (sympy.cosh if isinstance(base, sympy.sinh) else sympy.sinh)(base.args[0])
            b = powers.get(partner)
            if b is not None and b.is_Integer and b < 0:
                k = min(a, -b)
                # (cosh over sinh the other way round: 1/tanh(u) times sinh's remaining power)
                ratio = sympy.tanh(base.args[0]) ** (k if isinstance(base, sympy.sinh) else -k)
                rest = [f for f in node.args if f.as_base_exp()[0] not in (base, partner)]
                return sympy.Mul(*rest, ratio, base ** (a - k), partner ** (b + k))
    return None


def _rule_abs_of_power(node: sympy.Expr):
    """``Abs(b**e)`` -> ``Abs(b)**e`` for a real exponent, equal wherever either is defined
    (|b**e| = |b|**e for the principal power). As written it is nan for a negative base and
    a fractional exponent: SymPy's second derivative of (y**-2)**(y*y), |y|**(-2*y**2),
    held Abs(y**(1 + 2*y**2)), nan at every y < 0 (found by the fuzz campaign's
    gradgradcheck). A product is split first, ``Abs(a*b**e)`` -> ``Abs(a)*Abs(b)**e``: a
    --save speed second derivative of (|y + 3|/|x|)**x held Abs(((y + 3)/x)**x/(y + 3)**2),
    nan at every x < 0 (fuzz campaign 4124)."""
    if not isinstance(node, sympy.Abs):
        return None
    if node.args[0].is_Mul and any(_fractional_power(f) for f in node.args[0].args):
        return sympy.Mul(*(sympy.Abs(f) for f in node.args[0].args))
    if not _fractional_power(node.args[0]):
        return None
    base, exponent = node.args[0].as_base_exp()
    return sympy.Abs(base) ** exponent


def _rule_sign_abs_power(node: sympy.Expr):
    """``b**m*Abs(b)**e`` -> ``sign(b)*Abs(b)**(e + m)`` (odd m; even m: without the sign)
    for an exponent ``e`` that is not an integer: simplify writes the gradient of
    ``abs(x)**p`` (p a param) as ``p*x*Abs(x)**(p - 2)``, whose power overflows where the
    gradient need not: inf at x = 1e-30 in float32 for p = 0.5, where it is 5e14, and its
    double backward's ``Abs(x)**(p - 3)`` for p = 1.5 (found by an accuracy hunt)."""
    if not node.is_Mul:
        return None
    powers = dict(f.as_base_exp() for f in node.args)
    for f in node.args:
        base, e = f.as_base_exp()
        if not (isinstance(base, sympy.Abs) and e.is_Integer is False and e.is_extended_real):
            continue
        b = base.args[0]
        m = powers.get(b)
        if m is not None and m.is_Integer:
            rest = [g for g in node.args if g is not f and g.as_base_exp()[0] != b]
            return sympy.Mul(*rest, sympy.sign(b) ** (m % 2), base ** (e + m))
    return None


def real_abs_powers(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with every Abs of a power (or of a product holding one) as _rule_abs_of_power
    writes it, and nothing else rewritten: for the unstabilised derivative that double
    backward's reference differentiates. SymPy differentiates Abs(x**a) into
    x**a*sign(x**a), nan at every x < 0, so the second derivative of ((x**2)**c)'s
    |x|**(2c - 2)*x, with the reference nan there too, went unchecked and stayed nan (fuzz
    campaign 4131)."""
    for _ in range(_MAX_PASSES):
        rewritten = expr.replace(lambda node: isinstance(node, sympy.Abs), lambda node: _rule_abs_of_power(node) or node)
        if rewritten == expr:
            break
        expr = rewritten
    return expr


def _fractional_power(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is a power with a real exponent that may not be an integer (an
    integer power is finite as written)."""
    return bool(expr.is_Pow and expr.exp.is_extended_real is True and not expr.exp.is_integer)


_INVERSES = {sympy.atanh: sympy.tanh, sympy.asinh: sympy.sinh}


def _rule_inverse(node: sympy.Expr):
    """atanh(tanh(u)) and asinh(sinh(u)) are u on the reals (found by the fuzz campaign).

    (u = x/y is not provably real, y might be 0, but the generated code computes over the
    reals and the domain probe refuses complex values, so only a provably complex u stays.)
    """
    inverse = _INVERSES.get(type(node))
    if inverse is None or not isinstance(node.args[0], inverse):
        return None
    u = node.args[0].args[0]
    return u if u.is_extended_real is not False else None


def _rule_acosh_near_one(node: sympy.Expr):
    """``acosh(1 + u)`` -> ``log1p(u + sqrt(u)*sqrt(u + 2))``, acosh's principal branch: as
    written, 1 + u rounds to 1 where u is small, and the value, about sqrt(2*u), is lost: 0
    in float32 at u = 1e-8 where it is 1.4e-4 (found by an accuracy hunt). The Poincare-ball
    distance ``acosh(1 + 2*|x - y|**2/((1 - |x|**2)*(1 - |y|**2)))`` is of this form, with u
    small for nearby points. (Two roots, not sqrt(u*(u + 2)): u**2 overflows from u = 1.8e19
    in float32. ``u + sqrt(u)*sqrt(u + 2)``, about 2u, still does past half the largest
    float, where acosh is about 89 in float32; 2*asinh(sqrt(u/2)) would not, but ATen's
    asinh is slow. Not for a u that is never positive, whose roots SymPy folds to I.)"""
    if not isinstance(node, sympy.acosh):
        return None
    constant, u = node.args[0].as_coeff_Add()
    if constant != 1 or u == 0 or u.is_nonpositive:
        return None
    return log1p(u + sympy.sqrt(u) * sympy.sqrt(u + 2))


def _difference_of_squares(node: sympy.Add):
    """``c + k*u**2`` -> ``-k*(r - u)*(r + u)`` for numbers c > 0 > k with ``r = sqrt(-c/k)``
    rational with a power of 2 for its denominator (``1 - x**2`` -> ``(1 - x)*(1 + x)``):
    near ``|u| = r`` the square's rounding is left in the difference, 56 float32 ulps at x =
    0.999 in ``1 - x**2``, while ``r - u`` is exact there. asin's, acos's and atanh's
    derivatives ``1/sqrt(1 - x**2)`` and ``1/(1 - x**2)`` and the unit circle ``sqrt(1 -
    x**2)`` have it (found by an accuracy hunt; torch's own asin backward squares). (Even
    powers too: ``1 - x**4`` is ``(1 - x**2)*(1 + x**2)``, and the first factor splits
    again. Not ``u**2 - c``, defined on both sides of its roots, whose second-derivative
    Function, below, overflowed at large u where autograd's derivative was right: x/(x**2 -
    1)'s at x = 3e6 in float32; found in review. SymPy writes acosh's derivative with
    sqrt(x - 1)*sqrt(x + 1) itself.)

    A pass after the rules, which would otherwise split ``log(1 - x**2)``'s argument before
    _rule_log makes it ``log1p(-x**2)``, exact near 0 (found in review). Not for an r that
    rounds: its rounding would be left in ``r - u`` (``1 - 9*x**2`` was 0 in float32 at x =
    1/3; found in review). autograd's product rule on the factors cancels near u = 0 (asin's
    second derivative was 0 at x = 1e-8, found in review), so a formula with them gets the
    second-derivative Function (has_difference_of_squares)."""
    if len(node.args) != 2:
        return None
    c, term = node.as_coeff_Add()
    k, power = term.as_coeff_Mul()
    if not (c.is_Rational and k.is_Rational and c > 0 and k < 0 and power.is_Pow):
        return None
    base, exponent = power.as_base_exp()
    if not (exponent.is_Integer and exponent > 0 and exponent % 2 == 0):
        return None
    r = sympy.sqrt(-c / k)
    if not (r.is_Rational and sympy.Integer(r.q) & (r.q - 1) == 0):
        return None
    u = base ** (exponent // 2)
    factored = sympy.Mul(-k, r - u, r + u)
    # (1 - x**4: the first factor splits again)
    return factored.func(*(_difference_of_squares(f) or f if f.is_Add else f for f in factored.args))


def has_difference_of_squares(expr: sympy.Expr) -> bool:
    """Whether ``expr`` has a product of ``r - u`` and ``r + u`` (_difference_of_squares),
    whose derivative by autograd's product rule cancels near u = 0."""
    for node in sympy.preorder_traversal(expr):
        if node.is_Mul:
            # (powers of them too: atanh's 1/((1 - x)*(1 + x)) is a product of two)
            sums = [f.as_base_exp()[0] for f in node.args if f.as_base_exp()[0].is_Add]
            for first, second in itertools.combinations(sums, 2):
                # ((r - u) + (r + u) is 2r, and u has no number term, as _difference_of_squares
                # writes them: not the user's (x + 1)*(x + 2))
                total, gap = first + second, first - second
                if total.is_number and total.is_positive and not gap.is_number and gap.as_coeff_Add()[0] == 0:
                    return True
    return False


def has_offset_quotient(expr: sympy.Expr) -> bool:
    """Whether ``expr`` has a quotient ``c*v/(a + v)**k`` for numbers a != 0, c and k > 0
    (_rule_add's ``1/(1 + x) - 1`` -> ``-x/(1 + x)``), whose derivative by autograd's
    quotient rule, ``-c/(a + v) + c*v/(a + v)**2`` for k = 1, cancels at large v: log(1 + x) -
    x's second derivative was 2% off at x = 1e6 in float32, beyond the probes' reach."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, norm_ratio):
            # (_rule_power_minus_value's v/(a + v), kept whole: of v and a + v taken finite,
            # or of hypot_excess(u, a) and a + hypot_excess(u, a))
            a, v = node.args[1].as_coeff_Add()
            if isinstance(node.args[0], finite) or (a != 0 and v == node.args[0]):
                return True
        if not node.is_Mul:
            continue
        for factor in node.args:
            base, k = factor.as_base_exp()
            if base.is_Add and _number(k) and k.is_negative:
                a, v = base.as_coeff_Add()
                if a != 0 and (node / factor / v).is_number:
                    return True
    return False


def _rule_sigmoid_difference(node: sympy.Expr):
    """``c*sigmoid(a) - c*sigmoid(b)`` with ``b - a`` a number d < 0 -> ``-c*expm1(d)*
    sigmoid(a)*sigmoid(-b)`` (``(exp(a) - exp(b))/((1 + exp(a))*(1 + exp(b)))``; for d > 0
    the same with a and b swapped, so that |expm1(d)| < 1: as -c*expm1(d) the product
    overflowed, nan at every x for a gap of 100, found in review): where both are near 1
    they round to it, and the difference to 0. softclip ``softplus(x) - softplus(x - 1)``'s
    gradient ``sigmoid(x) - sigmoid(x - 1)`` was 0 in float32 from x = 17, where it is
    -expm1(-1)*sigmoid(x)*sigmoid(1 - x), 7e-8 (found by an accuracy hunt). (Not for a gap
    that varies, whose sign is unknown.)"""
    if not node.is_Add:
        return None
    sigmoids = [(t, c, f) for t in node.args for c, f in [t.as_coeff_Mul()] if isinstance(f, sigmoid)]
    for (term, c, f), (other, k, g) in itertools.permutations(sigmoids, 2):
        a, b = f.args[0], g.args[0]
        gap = _expand(b - a)
        if k == -c and gap.is_number and gap != 0 and c.is_positive:
            rest = node - term - other
            if gap.is_negative:
                return rest - c * expm1(gap) * f * sigmoid(_expand(-b))
            return rest + c * expm1(-gap) * g * sigmoid(_expand(-a))
    return None


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
        # its sign (found by the fuzz campaign). A false "vanishes" only costs a try:
        # removable() checks the limit itself.
        value = to_elementary(base).evalf(30, subs={x: sympy.Integer(0)})
        vanishes = bool(value.is_zero) or (value.is_Float and abs(value) < 1e-25)
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        # e.g. Max(zoo, ...) at 0; and SymPy's evalf of cos(log(y)**tanh(E)) at y = 0
        # raised AttributeError ('NoneType' object has no attribute 'subs'; fuzz
        # campaign 4131)
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
# integrals of stable_functions.removable evaluate them.
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


# -- Piecewise: the double where ---------------------------------------------------------


def _linear_bounds(symbol: sympy.Symbol, condition: sympy.Basic):
    """The bounds ``condition`` puts on ``symbol``: (lows, highs), each a list of (bound,
    strict); None where a relation on it is not a linear bound. Bounds may involve other
    symbols (``x > y`` gives the low ``y``)."""
    lows, highs = [], []
    relations = condition.args if isinstance(condition, sympy.And) else (condition,)
    for rel in relations:
        if symbol not in getattr(rel, "free_symbols", set()):
            continue
        if not isinstance(rel, sympy.core.relational.Relational) or rel.rel_op in ("==", "!="):
            return None
        lhs = rel.lhs - rel.rhs
        slope = lhs.diff(symbol)
        if not (_number(slope) and slope != 0) or lhs.diff(symbol, 2) != 0:
            return None
        bound = _expand(symbol - lhs / slope)  # where lhs == 0
        greater = (rel.rel_op in (">", ">=")) != bool(slope.is_negative)
        (lows if greater else highs).append((bound, rel.rel_op in (">", "<")))
    return lows, highs


def _safe_point(symbol: sympy.Symbol, condition: sympy.Basic):
    """A value of ``symbol`` at which ``condition`` holds, from linear bounds; or None.

    Bounds may involve other symbols (``x > y`` gives ``y + 1``); two numeric bounds give
    their midpoint.
    """
    bounds = _linear_bounds(symbol, condition)
    if bounds is None:
        return None
    lows, highs = ([b for b, _ in side] for side in bounds)
    if lows and highs:
        if len(lows) == len(highs) == 1 and _number(lows[0]) and _number(highs[0]) and lows[0] < highs[0]:
            return (lows[0] + highs[0]) / 2
        return None
    if len(lows) == 1:
        return lows[0] + 1
    if len(highs) == 1:
        return highs[0] - 1
    if lows and all(_number(b) for b in lows):
        return sympy.Max(*lows) + 1
    if highs and all(_number(b) for b in highs):
        return sympy.Min(*highs) - 1
    return None


def _never_holds(condition: sympy.Basic) -> bool:
    """Whether ``condition``, numeric linear bounds on one symbol, holds for no real value
    (``x <= 1/3 & x > 2/3``). Other conditions: False."""
    if len(getattr(condition, "free_symbols", ())) != 1:
        return False
    (symbol,) = condition.free_symbols
    bounds = _linear_bounds(symbol, condition)
    if bounds is None or not all(bounds) or not all(_number(b) for side in bounds for b, _ in side):
        return False
    (low, low_strict), (high, high_strict) = max(bounds[0]), min(bounds[1])
    return bool(low > high) or bool(low == high) and (low_strict or high_strict)


def _guard_piecewise(expr: sympy.Basic) -> sympy.Basic:
    """Guard the symbols of every non-polynomial Piecewise branch (the "double where").

    A branch is taken where its own condition holds and no earlier one does (the last
    branch's is the negation of the others), so ``guard(x, that, safe)`` is ``x`` there
    and a safe point elsewhere. A symbol is guarded only if no relation on it involves a symbol
    guarded already (``x > y`` guards ``x`` only: ``log(x - y)`` becomes
    ``log(guard(x, x > y, y + 1) - y)``).
    """
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    args = tuple(_guard_piecewise(a) for a in expr.args)
    node = expr.func(*args) if args != expr.args else expr
    if not isinstance(node, sympy.Piecewise):
        return node
    branches = []
    previous = []
    for value, condition in node.args:
        if condition is not sympy.true and _never_holds(condition):
            # Never taken, and dropped: where it stayed, unguardable (no point satisfies it),
            # double backward multiplied its nan by where's zero gradient (found by the fuzz
            # campaign's gradgradcheck: x**-x for x <= 1/3 & x > 2/3, nan at x < 0).
            continue
        taken = condition if condition is not sympy.true else sympy.And(*(sympy.Not(c) for c in previous))
        earlier = sympy.Or(*previous)
        previous.append(condition)
        if value.free_symbols and taken not in (sympy.true, sympy.false) and not _entire(value):
            value = _guard_branch(value, taken, condition, earlier)
        branches.append((value, condition))
    return sympy.Piecewise(*branches, evaluate=False)


# Functions finite, with finite derivatives of every order, at every real argument.
_ENTIRE_FUNCTIONS = (sigmoid, softplus, sympy.tanh, sympy.atan, sympy.sin, sympy.cos, sympy.erf)


def _entire(value: sympy.Basic) -> bool:
    """Whether ``value`` and its derivatives are finite at every real point: a polynomial,
    or sums, products and powers of those and of _ENTIRE_FUNCTIONS of them. Such a branch
    needs no guard: evaluated where it is not taken, it leaks nothing into double backward
    (an unguarded sigmoid costs one where less, and reads as written: BCE's gradient).
    In exact arithmetic: a power can still overflow in float32 (x**3 from |x| = 7e12)."""
    if value.is_number:
        return bool(value.is_finite)  # (sqrt(2) too, not only atoms: found in review)
    if value.is_Atom:
        return bool(value.is_Symbol)
    if value.is_Add or value.is_Mul:
        return all(_entire(a) for a in value.args)
    if value.is_Pow:
        return bool(value.exp.is_Integer and value.exp >= 0) and _entire(value.base)
    if isinstance(value, sympy.Piecewise):
        return all(_entire(v) for v, _ in value.args)
    return isinstance(value, _ENTIRE_FUNCTIONS) and all(_entire(a) for a in value.args)


def _guard_branch(value: sympy.Expr, taken: sympy.Basic, condition: sympy.Basic, earlier: sympy.Basic) -> sympy.Expr:
    """``value`` with its symbols guarded: each is itself exactly where the branch is taken
    (its ``condition`` holds and ``earlier``, the Or of the earlier branches' conditions,
    does not) and a safe point elsewhere. ``taken``: the condition that holds wherever the
    branch is taken (for the last branch, the earlier conditions negated).

    (Not where ``condition`` alone holds: a middle branch's condition may hold where an
    earlier branch is taken, and x*sqrt(3 - x) under x > 1, after 0 for x > 2, was evaluated
    at x = 4 and leaked nan into double backward, found in review.)

    First choice: the points that ``taken``'s linear bounds give, which keep the branch
    inside its own region (``x > y`` guards ``x`` by ``y + 1``). Where those leave the
    untaken branch's partial derivatives non-finite somewhere (a symbol the condition does
    not bound, as ``z`` in ``hypot(y, log(z))`` under ``x > 0``; an ``Or``, negated or
    nonlinear condition), every symbol of the branch is guarded by a number instead: a
    point found by probing where the branch and its partial derivatives are finite (found
    by the fuzz campaign's gradgradcheck: double backward multiplied where's zero by their
    nan); where no point tried passes, the first of _SAFE_NUMBERS all the same. Where SymPy
    cannot differentiate the branch into something the probe can evaluate, or on a branch
    of over _GUARD_PROBE_MAX_OPS operations, the linear guards stay.
    """
    bounded = sorted(value.free_symbols & taken.free_symbols, key=sympy.default_sort_key)
    relations = taken.args if isinstance(taken, sympy.And) else (taken,)
    replacements: dict[sympy.Symbol, sympy.Expr] = {}
    for s in bounded:
        if any(s in r.free_symbols and r.free_symbols & set(replacements) for r in relations):
            continue
        safe = _safe_point(s, taken)
        if safe is not None:
            replacements[s] = guard(s, condition, safe, earlier)
    linear = _replace_in_values(value, replacements) if replacements else value
    if sympy.count_ops(value) > _GUARD_PROBE_MAX_OPS:
        return linear
    symbols = sorted(value.free_symbols, key=sympy.default_sort_key)
    # autograd's derivative of a step is 0, so only the rest leaks into double backward; and
    # SymPy leaves sign(a*expm1(x/a))'s derivative unevaluated where it cannot tell that the
    # argument is real, which left CELU with its scale as a param unguarded (its second
    # derivative was nan from x = 88.7*a in float32; found by an accuracy hunt).
    probed = _steps_as_constants(value)
    try:
        partials = [probed.diff(s) for s in symbols]
    except (TypeError, ValueError, ArithmeticError, NotImplementedError):
        return linear
    if any(d.has(sympy.Derivative) for d in partials):
        # SymPy left one unevaluated (ceiling's): the probe cannot evaluate it, and putting
        # a number in for the symbol raised ("can't calculate derivative wrt 4", found by
        # fuzz campaign 4125).
        return linear
    # One evaluator of the branch and its partials serves both probes where no linear guard
    # changed them (lambdify costs tens of ms a call on a second derivative's branch).
    branch = _evaluator([probed, *partials], symbols)
    safe = {s: g.args[2] for s, g in replacements.items()}
    if _finite_where_untaken(partials, safe, None if safe else branch):
        return linear
    point = _finite_point(branch, symbols)
    if point is None:
        # No point tried makes it finite (it may be finite nowhere: (-x)**(x**2*acosh(x)) is
        # complex at every real x but 0 and 1). Guarded all the same: where a guard's own
        # where is not taken, its backward passes 0 and drops what the branch's backward
        # made of where's zero there, nan included. (A finite point is preferred only so that
        # no nan is computed at all: torch.autograd.detect_anomaly raises on one in double
        # backward.)
        # Left unguarded, the nan reached the gradient (fuzz campaigns 4124 and 4125).
        point = (_SAFE_NUMBERS[0],) * len(symbols)
    # ((-x)**(x**2*acosh(x)), under a condition that always holds after a branch taken for
    # x > 1.1, was nan there: fuzz campaign 4125.)
    return _replace_in_values(value, {s: guard(s, condition, p, earlier) for s, p in zip(symbols, point)})


# Piecewise-constant functions: autograd's derivative of each (torch.sign's, floor's) is 0.
_STEPS = (sympy.sign, sympy.Heaviside, sympy.floor, sympy.ceiling)


def _steps_as_constants(value: sympy.Expr) -> sympy.Expr:
    """``value`` with each step (_STEPS) as 1/2, for probing the derivatives autograd takes:
    a nonzero number in place of a factor whose own derivative is 0 keeps the size of the
    rest, which is what may overflow."""
    return value.replace(lambda node: isinstance(node, _STEPS), lambda node: sympy.S.Half)


def _replace_in_values(expr: sympy.Basic, rule: dict) -> sympy.Basic:
    """``expr.xreplace(rule)`` everywhere but inside conditions (relations and logic).

    A condition is never differentiated, so nothing leaks from it into double backward, and a
    guard there only costs code. It also cost a hang: with ``guard(x, x < 7, 6)`` on both
    sides of ``x <= loggamma(-log(x)/log(2))``, rebuilding the condition's Piecewise in
    to_elementary asked SymPy whether 6 <= loggamma(-log(6)/log(2)), whose real and
    imaginary parts it expanded for minutes (found by fuzz campaign 4125).
    """
    if expr in rule:
        return rule[expr]
    if expr.is_Atom or isinstance(expr, sympy.logic.boolalg.Boolean):
        return expr
    args = tuple(_replace_in_values(a, rule) for a in expr.args)
    return expr.func(*args) if args != expr.args else expr


def _finite_where_untaken(partials: list[sympy.Expr], safe: dict[sympy.Symbol, sympy.Expr], branch=None) -> bool:
    """Whether a branch's ``partials`` (its partial derivatives), with ``safe`` substituted,
    are finite and moderate at every point of _UNTAKEN_PROBES_PER_COUNT in the symbols left
    free. ``branch``: an _evaluator of the branch and its partials, to use where ``safe``
    is empty (the branch's value it computes first is not checked).

    What leaks into double backward through where's zero is the untaken branch's local
    derivatives (0 * nan), not its value: ``log(y)`` at y < 0 is nan, and its derivative
    ``1/y`` finite. (Strictly it is the derivatives of the formulas that compute the
    partials, which may be singular where the partials are finite, ``|z|**(3/2)``'s at 0:
    the partials stand in for them.)
    """
    try:
        # (Not inside conditions, as the guards are put in: a nested Piecewise's condition
        # tests the symbol itself, found in review.)
        partials = [_replace_in_values(d, safe) for d in partials]
    except (TypeError, ValueError, ArithmeticError):
        return False
    free = sorted(set().union(*(d.free_symbols for d in partials)), key=sympy.default_sort_key)
    if len(free) > len(_UNTAKEN_PROBES_PER_COUNT):
        return False
    points = itertools.product(_UNTAKEN_PROBES_PER_COUNT[len(free) - 1], repeat=len(free)) if free else [()]
    if branch is not None and not safe:
        # (Its symbols are all free, in the same order: the branch's own symbols.)
        return _moderate_at(branch, points, skip=1)
    return _moderate_at(_evaluator(partials, free), points)


def _finite_point(branch, symbols: list[sympy.Symbol]) -> tuple[sympy.Expr, ...] | None:
    """A point, a number for each of ``symbols``, at which ``branch`` (an _evaluator of a
    branch and its partial derivatives) gives finite and moderate values; None if the few
    points tried all fail.

    Tried in order: every symbol at the same number of _SAFE_NUMBERS, then (up to three
    symbols) combinations of the first four, so that ``log(x - y)``, singular wherever x =
    y, finds x = 3/2, y = 1/2.
    """
    candidates = [(c,) * len(symbols) for c in _SAFE_NUMBERS]
    if len(symbols) <= 3:
        candidates += [p for p in itertools.product(_SAFE_NUMBERS[:4], repeat=len(symbols)) if len(set(p)) > 1]
    return next((point for point in candidates if _moderate_at(branch, [point])), None)


def _evaluator(exprs: list[sympy.Expr], symbols: list[sympy.Symbol]):
    """``exprs`` as one mpmath function of ``symbols`` that refuses complex and
    float64-overflowing intermediates, as torch would compute them; None where they cannot
    be printed for mpmath (an unevaluated Derivative of floor(u), say). Made once per
    branch: lambdify costs about 20 ms, far more than an evaluation."""
    try:
        return real_only(probe_code(symbols, exprs))
    except (TypeError, ValueError, KeyError, NameError, SyntaxError, NotImplementedError):
        return None


def _moderate_at(evaluate, points, skip: int = 0) -> bool:
    """Whether ``evaluate`` (an _evaluator) gives values that are all real, finite and at
    most _UNTAKEN_MAX_ABS in size at every point (all but the first ``skip`` of them)."""
    if evaluate is None:
        return False
    for point in points:
        try:
            values = evaluate(*point)
        except PROBE_FAILURES:
            return False
        if not all(moderate(value, _UNTAKEN_MAX_ABS) for value in values[skip:]):
            return False
    return True


# Branches larger than this keep the linear guards unprobed: differentiating and printing
# them for the probe took 0.2-0.4 s each on a second derivative's branches of 50-90
# operations (a three-input Piecewise took 6 s to generate, against 1.5 s unprobed). The
# bound is the simplification bound (derive.SIMPLIFY_MAX_OPS).
_GUARD_PROBE_MAX_OPS = 40
# Where a branch is not taken, its symbols may hold any value: these are the probes, per
# count of symbols left free (1, 2, 3; with more, the branch takes a probed point without
# trying the linear bounds). The large ones are where float32's exp and cosh overflow
# (from 89), 0 where powers and logs are singular.
_UNTAKEN_PROBES_PER_COUNT = (
    (-1e4, -100.0, -3.0, -0.5, 0.0, 0.5, 3.0, 100.0, 1e4),
    (-100.0, -0.5, 0.0, 0.5, 100.0),
    (-100.0, -0.5, 0.0, 0.5, 100.0),
)
# Beyond this a partial derivative is taken as overflowing in float32 (3.4e38), with room
# for the larger intermediates of the code that computes it.
_UNTAKEN_MAX_ABS = 1e30
# Safe points, tried in order: moderate numbers in the domains of log, sqrt, acosh (> 1),
# asin and atanh (< 1) and of negative powers.
_SAFE_NUMBERS = tuple(sympy.Rational(r) for r in ("1/2", "3/2", "1", "2", "1/4", "3", "-1/2", "-1", "5", "-2"))
