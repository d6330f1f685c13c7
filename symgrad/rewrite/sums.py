"""Rules for sums that cancel: ``1 - tanh**2``, ``1 + tanh``, ``1 + erf``, ``1 - sigmoid``,
a large part split off a sum, differences of squares, and ``x*log(y)`` as ``xlogy``.
"""

from __future__ import annotations

import itertools

import sympy
from sympy.codegen.cfunctions import expm1

from ..math.functions import finite, logaddexp, ndtr, norm_ratio, sigmoid, softplus, xlogy
from .patterns import (
    _expand,
    _is_minus_abs,
    _LOG2,
    _minus_abs,
    _number,
    _positive_part,
    _size,
    _SQRT2,
    same_number,
)


def _near_cancellation(c: sympy.Expr, k: sympy.Expr) -> bool:
    """Whether ``c + k*t`` for ``t`` in [0, 1] cancels as ``t`` nears 1 without crossing 0:
    numbers of opposite signs, ``c + k`` of ``c``'s sign and at most ``|k|/8`` (beyond
    that, the rounding of ``k*t`` is at most 8 ulps of the sum as written)."""
    if not (_number(c) and _number(k)) or not (c * k).is_negative:
        return False
    margin = c + k
    return bool((margin * c).is_positive) and bool(8 * abs(margin) <= abs(k))


def _rule_add(node: sympy.Expr):
    """Cancellations between a constant and a bounded function (see :mod:`symgrad.rewrite`)."""
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
                # near 0; sigmoid(x) - 0.5, 0 in float32 at x =
                # 1e-8, by a fourth)
                return remainder - constant * sympy.tanh(f.args[0] / 2)
            if f.is_Pow and f.exp == -1 and isinstance(f.base, sigmoid) and same_number(constant, -coeff):
                # c*(1/sigmoid(u) - 1): BCE's derivative by its target, log(1/sigmoid(x) - 1),
                # was log(0) = -inf from x = 17 in float32 where it is -x
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
                # (coth's derivative written with exponentials)
                return remainder + 2 * coeff / expm1(_expand(2 * f.base.args[0]))
            if f.is_Pow and f.exp == -1 and isinstance(f.base, sympy.tanh) and same_number(constant, coeff):
                return remainder - 2 * coeff / expm1(_expand(-2 * f.base.args[0]))  # c*(1/tanh(u) + 1)
        if isinstance(f, softplus):
            u = f.args[0]
            half = _expand(-u / 2)
            # (Not of a v with |.|: log(cosh(v))'s own form above |v| = 1, _log_cosh, where it
            # does not cancel; 2*|x| for log(cosh(2*x)) nested it 5 deep.)
            if not half.has(sympy.Abs) and coeff * half in terms and -coeff * _LOG2 in terms:
                # v + softplus(-2v) - log(2) == log(cosh(v)), whose own form does not cancel
                # near 0: torch's TanhTransform log-determinant 2*(log(2) - x - softplus(-2x))
                # was 0 in float32 at x = 1e-4
                return rest - coeff * half + coeff * _LOG2 + coeff * sympy.log(sympy.cosh(half))
            others = rest + coeff * u  # softplus(u) == u + softplus(-u); like terms cancel
            if _size(others) < _size(rest):
                return others + coeff * softplus(_expand(-u))
            partner = -coeff * softplus(_expand(-u))  # softplus(u) - softplus(-u) == u (0 - 0 near 0)
            if partner in terms:
                return rest - partner + coeff * u
        if isinstance(f, logaddexp):  # logaddexp(a, b) - a == softplus(b - a)
            a, b = f.args
            if _expand(a + b) == 0 and not a.has(sympy.Abs) and -coeff * _LOG2 in terms:  # logaddexp(v, -v) - log(2)
                return rest + coeff * _LOG2 + coeff * sympy.log(sympy.cosh(a))
            for a, b in (f.args, f.args[::-1]):
                # (Not for a b that is a logaddexp itself: b - a would cancel as the sum did,
                # where _rule_exp_lse subtracts a inside it; 3-input softmax.)
                if -coeff * a in terms and not b.has(logaddexp):
                    return rest + coeff * a + coeff * softplus(_expand(b - a))
        for factor in sympy.Mul.make_args(term):
            if factor.is_Pow and factor.exp == -1 and isinstance(factor.base, sympy.tanh):
                # c*A/tanh(u) - c*A == 2*c*A/expm1(2u) (and + c*A, -2*c*A/expm1(-2u)): the
                # two terms cancel where tanh(u) rounds to 1 (from u = 9 in float32), the
                # gradient of coth written with exponentials, as the rules distribute it
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
                # in float32 at x = 1e-8
                return rest + partner + coeff * sympy.tanh(f.args[0] / 2)
    return None


def _rule_large_part(node: sympy.Expr):
    """Sums where softplus(u)'s or sigmoid(u)'s large part cancels against other inputs.

    BCE with logits, ``x - x*t + log(1 + exp(-x))``, is ``softplus(x) - t*x`` after the
    rules above: at the hard label t = 1 the loss is softplus(-x), 4e-8 at x = 17, but
    softplus(x) rounds to x in float32 there and the difference is 0 (8.3e-3 off at
    x = 10); its gradient sigmoid(x) - t rounds the same way.
    F.binary_cross_entropy_with_logits splits off max(x, 0) for the same reason.

    - ``c*softplus(u) + k*u`` (k free of u's symbols) -> ``where(u > 0, (c + k)*u, k*u) +
      c*softplus(-|u|)``: softplus(u) is max(u, 0) + softplus(-|u|), and the linear parts
      meet in one term, so they cancel exactly before the small part is added.
    - ``c*sigmoid(u) + r`` (r free of u's symbols, not a number) -> ``where(u > 0, c + r, r)
      + where(u > 0, -s, s)`` with s = c*sigmoid(-|u|): sigmoid(u) is 1 - sigmoid(-u) for u > 0.
    - ``c*Max(u, 0) + k*u`` (k free of u's symbols, not a number) -> ``where(u > 0, (c + k)*u,
      k*u)``: the hand-written BCE with logits, ``Max(x, 0) - x*t + log(1 + exp(-abs(x)))``,
      was 3.5% off at x = 20 with the soft label t = 0.999999 in float32, where ``x - x*t``
      cancels and ``x*(1 - t)`` is exact.

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


def _rule_xlogy(node: sympy.Expr):
    """``u*log(b)**k`` -> ``xlogy(...xlogy(u, b)..., b)`` (k times, k a positive integer): 0
    where u is 0, as the mathematics is wherever u vanishes faster than the log grows. A
    power of the log comes from differentiating b**y by y twice: --save speed's d2/dy2 of
    Max(x, 0)**y, b**y*log(b)**2, was 0*inf = nan at every x < 0.
    """
    if not node.is_Mul:
        return None
    factors = sympy.Mul.make_args(node)
    logs = [f for f in factors if isinstance(f.as_base_exp()[0], sympy.log) and _positive_integer(f.as_base_exp()[1])]
    if len(logs) != 1 or not logs[0].as_base_exp()[0].args[0].free_symbols:
        # log of a constant is a constant factor: nothing for xlogy to guard, and SymPy may
        # have folded 200*log(10) into log(10**200), an int beyond float range
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
    every x < 0 (and so were ``(x > c)**e`` and ``Heaviside(x)**e``)."""
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


def _difference_of_squares(node: sympy.Add):
    """``c + k*u**2`` -> ``-k*(r - u)*(r + u)`` for numbers c > 0 > k with ``r = sqrt(-c/k)``
    rational with a power of 2 for its denominator (``1 - x**2`` -> ``(1 - x)*(1 + x)``):
    near ``|u| = r`` the square's rounding is left in the difference, 56 float32 ulps at x =
    0.999 in ``1 - x**2``, while ``r - u`` is exact there. asin's, acos's and atanh's
    derivatives ``1/sqrt(1 - x**2)`` and ``1/(1 - x**2)`` and the unit circle ``sqrt(1 -
    x**2)`` have it (torch's own asin backward squares). (Even
    powers too: ``1 - x**4`` is ``(1 - x**2)*(1 + x**2)``, and the first factor splits
    again. Not ``u**2 - c``, defined on both sides of its roots, whose second-derivative
    Function, below, overflowed at large u where autograd's derivative was right: x/(x**2 -
    1)'s at x = 3e6 in float32. SymPy writes acosh's derivative with
    sqrt(x - 1)*sqrt(x + 1) itself.)

    A pass after the rules, which would otherwise split ``log(1 - x**2)``'s argument before
    _rule_log makes it ``log1p(-x**2)``, exact near 0. Not for an r that
    rounds: its rounding would be left in ``r - u`` (``1 - 9*x**2`` was 0 in float32 at x =
    1/3). autograd's product rule on the factors cancels near u = 0 (asin's
    second derivative was 0 at x = 1e-8), so a formula with them gets the
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
