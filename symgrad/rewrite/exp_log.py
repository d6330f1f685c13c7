"""Rules for exponentials and logarithms: log1p/expm1/softplus/logaddexp forms, sigmoid
ratios of exponentials, softmax and logsumexp, log of sinh/cosh/tanh, and the passes that
distribute sums so that exponentials meet (each rule's docstring states its identity).
"""

from __future__ import annotations

import itertools

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from ..math.functions import guard, hypot, hypot_excess, log1mexp, log_sinh, logaddexp, sigmoid, softplus
from ..math.series import removable
from .patterns import (
    _denominator_factor,
    _exp_factors,
    _exp_term,
    _expand,
    _has_exp,
    _normalize_denominator,
    _number,
    _replace_each,
    _split_exponent,
)
from .piecewise import _can_overflow, _never_holds


_MAX_EXPAND_OPS = 80  # numerators bigger than this are not distributed over a ratio
_FACTOR_MAX_TERMS = 6  # sums of exponentials with more terms are not factored ...
_FACTOR_MAX_DEGREE = 6  # ... nor those of exp(k*u) with k's numerator or denominator above this


def _rule_ratio(node: sympy.Expr):
    """Ratios of exponentials -> sigmoids (see :mod:`symgrad.rewrite`).

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
        elif isinstance(f, sympy.cosh) and coeff == -constant:  # c*cosh(u) - c
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
    finish in 300 s (and building the polynomial for exp(10**9*x) ran out of a 3 GB limit).
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
    ``(expm1(-x)**2 - exp(-x))*exp(-x - exp(-x))``, was nan from x = -45 in float32.
    Each term's own exps then join the exponent, and _expm1_times_exp takes
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
    off at x*y = 1e-6 in float32, and its gradient not 0 at x*y = 0)."""
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
    exp(-x))*expm1(-x)`` was nan from x = -89 in float32, as naive autograd's is, and its
    second derivative, with ``expm1(-x)**2``, from x = -45. Up to
    k*v = 20, expm1(v)**k stays below e**20; above, ``(-expm1(-v))**k`` is at least 1 -
    k*exp(-20/k) (1 - 2e-9 for k = 1, 1 - 9e-5 for k = 2), so ``exp(u + k*v)`` overflows
    where the product does, or within that much of the format's largest number. (From v >
    0 on, the where made an inf of ``expm1(x/100)*exp(x)`` at x = 88 in float32, where it
    is 2.3e38.) For ``u = -k*v`` the product is ``(-expm1(-v))**k*r``,
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
    right; now it is ``(x*exp(-x) + expm1(-x))/x**2``.

    Likewise times ``sinh(u/2)**-2``: ``expm1(u)/sinh(u/2)**2 = -4/expm1(-u)``, only for the
    expm1 term, the others keeping the sinh: ``x/(1 - exp(-x))``'s gradient ``-(x -
    expm1(x))/(4*sinh(x/2)**2)`` was inf/inf = nan from x = 89 in float32; now it is
    ``-x/(4*sinh(x/2)**2) - 1/expm1(-x)``, 1.1% off from x = -88.7 to -92 (the missing term,
    1/|x| of the gradient, is below float32's range there, where the gradient is not).
    (Written all with ``4*sinh(u/2)**2 = -expm1(u)*expm1(-u)`` it was 0 there, and its double
    backward nan.)
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
    inf/inf = nan from |x| = 90 in float32; distributed it is
    ``-2*x*tanh(x)/cosh(x)**2 + 2/cosh(x)**2``."""

    def spread(node: sympy.Mul) -> sympy.Expr | None:
        # (integer powers: _rule_sinh_over_cosh takes no others)
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
    in float32. (Only of exp(v): ``c*exp(v)`` is positive, so
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
    """Logarithms whose argument overflows, underflows or rounds to 1, as equal forms that
    do not: ``log(1 + u)`` -> ``log1p(u)``; ``log1p(p*exp(a))`` -> ``softplus(a + log(p))``;
    ``log(b**u*r)`` -> ``u*log(b) + log(r)`` for a number b > 0; ``log(sigmoid(u))`` ->
    ``-softplus(-u)``; ``log(cosh(u))`` (_log_cosh); ``log(c*expm1(u))`` -> ``log(c) + u +
    log1mexp(-u)``, and ``log(-c*expm1(u))`` -> ``log(c) + log1mexp(u)``; ``log(c*tanh(u))``
    -> ``log(|c|) - log1p(2/expm1(+-2u))``; ``log(c*sinh(u))`` and its ratios
    (_log_sinh_ratio); ``log(p*exp(a) - p*exp(b))`` -> ``log(p) + a + log1mexp(b - a)``; a
    hand-written asinh (_asinh_argument); ``log(exp(a) + exp(b) + ...)`` -> nested
    ``logaddexp``; ``log(c*exp(v)*(1 + exp(w)))`` -> ``log(c) + v + softplus(w)``.
    """
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
        # log(10**(-x**3*exp(x))) was -inf in float64 from x = 3.
        rest = sympy.Mul(*(f for f in factors if f not in powers))
        return sympy.Add(*(f.exp * sympy.log(f.base) for f in powers)) + sympy.log(rest)
    if isinstance(arg, sigmoid):
        return -softplus(-arg.args[0])
    if isinstance(arg, sympy.cosh) and not arg.args[0].has(sympy.Piecewise):
        # (Not of a Piecewise, such as an inner log-cosh: the form repeats its argument, and
        # nested four deep it took 70 s to build.)
        return _log_cosh(arg.args[0])
    scale, call = arg.as_coeff_Mul()
    if isinstance(call, expm1) and scale.is_positive:
        # log(expm1(u)) (the inverse of softplus): expm1 overflows from u = 89 in float32
        # where the log is u; u + log(1 - exp(-u)) never does.
        # (For u < 0 both are undefined.)
        u = call.args[0]
        return sympy.log(scale) + u + log1mexp(-u)
    if isinstance(call, expm1) and scale.is_negative:
        # log(1 - exp(u)): as log(-expm1(u)) it is 0 in float32 from u = -17, where it is
        # about -exp(u)
        return sympy.log(-scale) + log1mexp(call.args[0])
    if isinstance(call, sympy.tanh) and scale.is_nonzero and not call.args[0].has(sympy.Piecewise):
        # log(tanh(u)), real for u > 0: tanh rounds to 1, and the log, about -2*exp(-2u),
        # was 2e-4 off in float32 at u = 5, 96% at 9 and 0 above.
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
            # exp(b)) to logaddexp: as log1p it overflowed
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
    sigmoid(x)))``, from |x| = 88."""
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


def _asinh_argument(arg: sympy.Expr) -> sympy.Expr | None:
    """log(u + sqrt(u**2 + 1)) is asinh(u), and log(sqrt(u**2 + 1) - u) is -asinh(u).

    As written, u + hypot(u, 1) cancels for u < 0: in float32 the log is 1e-4 off at
    u = -100 and -inf from u = -4096, and 0 at u = -1e-30; torch.asinh is within an ulp
   . The rules run
    bottom-up, so the root is already hypot(u, 1) here, or hypot_excess(u, 1) (which is
    hypot(u, 1) - 1) where u has a negative constant term; and u + hypot(u, 1) may be
    flattened into one sum with u's own terms.
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
    |u| - log(2) + softplus(-2|u|), whose terms cancel by at most 4x there.
    The condition is two linear bounds, not |u| < 1, so that _guard_piecewise
    can guard the branches (the "double where": sinh(u/2)**2 overflows from |u| = 179 in
    float32 on the branch not taken).
    """
    magnitude = sympy.Abs(u)
    return sympy.Piecewise(
        (log1p(2 * sympy.sinh(u / 2) ** 2), (u > -1) & (u < 1)),
        (magnitude - sympy.log(2) + softplus(-2 * magnitude), True),
    )


def _log_sinh_ratio(arg: sympy.Expr) -> sympy.Expr | None:
    """``log(c*u**m*sinh(u)**k)`` for a number c and integers m and k, else None. As written
    sinh overflows from |u| = 89 in float32, where the log of sinh(u) is u - log(2)
    (functions.log_sinh): ``log(k) - log(sinh(k))``, ``log(x/sinh(x))`` (the von
    Mises-Fisher log-normaliser) and ``log(sinh(x)**2)`` were -inf there.

    - Without u**m: ``log(|c|) + k*log_sinh(|u|)`` for an even k, ``k*log_sinh(+-u)`` for an
      odd one (real where c*sinh(u)**k > 0: ``log(sinh(u))`` for u > 0, ``log(-sinh(u))``
      for u < 0), everywhere: nothing cancels.
    - With it, for m = +-k and c > 0 (the product positive for either sign of u): ``log(c) +
      m*log(|u|) + k*log_sinh(|u|)``, everywhere for m = k, whose terms have one sign; for
      m = -k (``u/sinh(u)``) only above |u| = 1, and below ``log1p(c*u**m*sinh(u)**k - 1)``,
      the product whole, near 1 there: the split terms would cancel near 0, and its
      removable singularity at 0 gets its series. (That form for m = k, whose product is
      near 0 there, was -inf at x = 1e-4 for log(x*sinh(x)).) The
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


def _rule_same_base(node: sympy.Expr):
    """``b**e/b`` -> ``b**(e - 1)`` (SymPy keeps them apart for a symbolic ``e``): 0/0 =
    nan where b = 0 as written, as in --save speed's d2/dxdy of Max(x, 0)**y."""
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
    are inf*0 = nan in float32 from x = 45 and x = 89 as the ratio rules leave them.
    """
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
    sigmoid(-x)`` inf*0 from x = 89."""
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
    inf/inf = nan from u = 89 in float32 as written, and 1/(1 - exp(-u)) is not.
    """
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
    where b > a: ``exp(2*y)/(exp(x) - exp(y))**2`` was nan at (-100, 0) that way.)
    """
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
    it, is inf/inf = nan from x = 179 in float32, where tanh(x/2)/cosh(x/2)**2 is 0;
    so was the gradient of 1/cosh(x)**2, -2*sinh(x)/cosh(x)**3,
    from |x| = 90. The other way round, ``cosh(u)**a*sinh(u)**-b`` ->
    ``tanh(u)**-k*...``: the Langevin function coth(x) - 1/x's second derivative,
    2*cosh(x)/sinh(x)**3 - 2/x**3, was nan from |x| = 90 in float32,
    where autograd differentiating 1/tanh(x) is finite."""
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


_INVERSES = {sympy.atanh: sympy.tanh, sympy.asinh: sympy.sinh}


def _rule_inverse(node: sympy.Expr):
    """atanh(tanh(u)) and asinh(sinh(u)) are u on the reals.

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
    in float32 at u = 1e-8 where it is 1.4e-4. The Poincare-ball
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


def _rule_sigmoid_difference(node: sympy.Expr):
    """``c*sigmoid(a) - c*sigmoid(b)`` with ``b - a`` a number d < 0 -> ``-c*expm1(d)*
    sigmoid(a)*sigmoid(-b)`` (``(exp(a) - exp(b))/((1 + exp(a))*(1 + exp(b)))``; for d > 0
    the same with a and b swapped, so that |expm1(d)| < 1: as -c*expm1(d) the product
    overflowed, nan at every x for a gap of 100): where both are near 1
    they round to it, and the difference to 0. softclip ``softplus(x) - softplus(x - 1)``'s
    gradient ``sigmoid(x) - sigmoid(x - 1)`` was 0 in float32 from x = 17, where it is
    -expm1(-1)*sigmoid(x)*sigmoid(1 - x), 7e-8. (Not for a gap
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


def _rule_exp_cosh(node: sympy.Expr):
    """``exp(a)*cosh(b)**k`` -> ``((exp(a/k + b) + exp(a/k - b))/2)**k`` for a positive
    integer k and a non-constant ``a``: a huge and a tiny factor never meet. As written,
    ``exp(-x)*cosh(x)`` is inf*0 = nan from x = 89 in float32, where it is ``(1 +
    exp(-2*x))/2``; each term of the sum is at most the result's k-th root, so nothing
    overflows that the result itself does not (cosh(b) = (exp(b) + exp(-b))/2)."""
    if not node.is_Mul:
        return None
    exps = [f for f in node.args if isinstance(f, sympy.exp) and not f.args[0].is_number]
    if len(exps) != 1:
        return None  # (several: _rule_merge_exp joins them first)
    for f in node.args:
        base, k = f.as_base_exp()
        if isinstance(base, sympy.cosh) and k.is_Integer and k > 0:
            a, b = exps[0].args[0] / k, base.args[0]
            rest = sympy.Mul(*(g for g in node.args if g is not f and g is not exps[0]))
            halves = (sympy.exp(_expand(a + b)) + sympy.exp(_expand(a - b))) / 2
            return rest * halves**k
    return None


def _rule_sinh_cosh_sum(node: sympy.Expr):
    """``r*sinh(u) + r*cosh(u)`` -> ``r*exp(u)`` and ``r*sinh(u) - r*cosh(u)`` ->
    ``-r*exp(-u)``: the pair cancels where both overflow. The gradient of
    ``exp(-x)*cosh(x)``, ``(sinh(x) - cosh(x))*exp(-x)``, was 0 from x = 9 in float32,
    where it is ``-exp(-2*x)``, and inf - inf = nan from x = 89."""
    if not node.is_Add:
        return None
    terms = list(node.args)
    for term in terms:
        for f in sympy.Mul.make_args(term):
            if not isinstance(f, sympy.sinh):
                continue
            u, rest = f.args[0], term / f
            for sign in (1, -1):
                partner = sign * rest * sympy.cosh(u)
                if partner in terms:
                    others = [t for t in terms if t is not term and t != partner]
                    joined = rest * sympy.exp(u) if sign == 1 else -rest * sympy.exp(-u)
                    return sympy.Add(*others, joined)
    return None
