"""Rules for roots and powers: hypot and its excess over a number, norm ratios, a root plus
what it nearly cancels (hypot_plus), a power minus its value (power_excess, sums of roots),
and real powers of absolute values.
"""

from __future__ import annotations

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from ..math.functions import finite, hypot, hypot_excess, hypot_order, hypot_plus, norm_ratio, power_excess
from .patterns import _affine, _expand, _MAX_PASSES, _number, _replace_each, _ROOT_SUMS, _size, same_number


_HYPOT_SUM_MAX_TERMS = 24  # sums with more terms are not searched for hypot(u, b) +- u pairs


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
    its gradient ``x/(2*hypot(x, 2)) + 1/2`` likewise; ``sqrt(x**2 + 1) - x`` from 4096.
    So would the derivatives of ``r = hypot_plus(u, b)``: ``r/h**2 -
    u*r/h**3`` where ``u`` is large and positive, and ``-b/h**2 + r*b/h**3`` where ``u`` is
    small. Not where ``s*u`` is nonnegative, which cannot cancel; nor for a number ``u``
    (_rule_hypot_excess); nor for a ``b`` that is not a number (``hypot(x, y) - y``): it can
    be 0, and the quotient is then 0/0 at the origin, where the difference is 0.
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
    """``(a**2 + b**2 + ...)**(k/2)`` for an odd k -> ``hypot(hypot(a, b), ...)**k``: the
    squares overflow (float32: from |a| = 1.8e19) and underflow where the norm does not.
    Numbers count as squares (``1/sqrt(x**2 + 1)`` is ``hypot(x, 1)**-1``); an even k is a
    polynomial and stays."""
    if not (node.is_Pow and node.base.is_Add and _number(node.exp)):
        return None
    twice = 2 * node.exp
    if twice.is_Float and float(twice).is_integer():  # (a Float is never == an Integer)
        twice = sympy.Integer(int(twice))  # (x**2 + 1)**0.5 is sqrt(x**2 + 1)
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
    which keeps the small part near x = 0 that the difference rounds away.
    The denominator adds two positive numbers, so it cannot cancel. (A sum
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
            # (sqrt(exp(x) + 3) - 1 at x = 100 in float32)
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
    x = 1e-4, and Tukey's biweight ``1 - (1 - x**2)**3`` 3x off there.

    - A positive integer ``p`` (up to _QUOTIENT_MAX_DEGREE, 8; a Float such as 3.0 too) ->
      ``k*D*S``, ``S = A**(p-1) + A**(p-2)*B + ... + B**(p-1)`` by Horner's scheme
      (``A**p - B**p = (A - B)*S``), with ``A + B`` taken out for an even ``p``, which
      leaves even powers of ``A``: no term cancels where ``A`` and ``B`` have one sign, nor
      anywhere for an even ``p``; for an odd one, where they do not, the sum loses at most
      p ulps. (The binomial ``u*Q(u)`` cancelled for ``|u|`` beyond ``|B|``: ``(1 + x)**8 - 1``
      was 2.6e-2 off at x = -2.001 in float32; an exponent 3.0 took the expm1 form, nan
      where ``A < 0``.)
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
            # x) - x's gradient 1/(1 + x) - 1 was 0 in float32 at x = 1e-8.
            # Its own derivative cancels at large D, which has_offset_quotient sees.
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
#.)

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
      5e25). Where ``excess`` can overflow, it and ``a`` are taken finite
      (functions.finite): the value tends to ``-b**p`` there, and the quotient
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
    ``Float(1e6)**(1/3)`` at 15 digits, printed 99.99999999999997), and
    a number, not a quotient of big integers that SymPy pulls out of the sums (0.3's
    reciprocal's made a coefficient 2.9e-47, 0 in float32: nan at every x for
    ``(0.3 + x)**-4.25 - 0.3**-4.25``)."""
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
    near x = 1; and in float16 ``16 + 65504`` would round to inf.)"""
    base, excess = _finite_where_it_overflows(b + excess, excess)
    return norm_ratio(excess, base)


def _finite_where_it_overflows(*values: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """``values`` (the last of them an excess) as they are where the excess cannot
    overflow (_cannot_overflow), else each taken finite (functions.finite)."""
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
    # 1/a, inf, would make the quotient inf/inf
    a, excess = _finite_where_it_overflows(a, excess)
    r, s, root_difference = _roots(a, b, excess, q)
    return _root_sums(smaller, smaller_b, difference, whole, m, 1 / r, 1 / s, -norm_ratio(root_difference, r) / s)


def _bounded_above(excess: sympy.Expr) -> bool:
    """Whether ``excess`` stays finite where the inputs are, or can only overflow to -inf:
    for ``p > 0`` a root of ``b + excess`` is inf/inf where it overflows to +inf, where the
    difference as written was inf (taken finite, it would be a wrong finite number: the
    value grows with ``excess``; ``3*x - 2*y`` overflows from x = 1.1e38 in float32).
    """
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
    0.)
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


def _rule_abs_of_power(node: sympy.Expr):
    """``Abs(b**e)`` -> ``Abs(b)**e`` for a real exponent, equal wherever either is defined
    (|b**e| = |b|**e for the principal power). As written it is nan for a negative base and
    a fractional exponent: SymPy's second derivative of (y**-2)**(y*y), |y|**(-2*y**2),
    held Abs(y**(1 + 2*y**2)), nan at every y < 0.
    A product is split first, ``Abs(a*b**e)`` -> ``Abs(a)*Abs(b)**e``: a
    --save speed second derivative of (|y + 3|/|x|)**x held Abs(((y + 3)/x)**x/(y + 3)**2),
    nan at every x < 0."""
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
    double backward's ``Abs(x)**(p - 3)`` for p = 1.5."""
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
    |x|**(2c - 2)*x, with the reference nan there too, went unchecked and stayed nan.
    """
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


# -- powers that overflow where the value they feed does not ------------------------------


def _overflowing_powers(expr: sympy.Expr) -> sympy.Expr:
    """_log_of_power_sum on every log, _log1p_of_power on every log1p, then _power_ratio on
    every product: a pass after the bottom-up rules, whose branches hold the node as written
    (the rules would take it again)."""
    expr = _replace_each(expr, sympy.log, _log_of_power_sum)
    expr = _replace_each(expr, log1p, _log1p_of_power)
    return _replace_each(expr, sympy.Mul, _power_ratio)


def _log_of_power_sum(node: sympy.log):
    """``log(s*(c + k*u**p))``, numbers s > 0 and c > 0 -> ``log(s*c) + log1p((k/c)*u**p)``
    for _log1p_of_power to take (the rules leave ``log1p`` only for s*c = 1): the Cauchy log
    density ``-log(pi*(1 + x**2))`` was -inf in float32 from |x| = 1.8e19."""
    arg = node.args[0]
    scale, rest = arg.as_independent(*arg.free_symbols, as_Add=False)
    c, power = rest.as_coeff_Add()
    if not (scale.is_positive and c.is_positive) or scale * c == 1 or _large_power(power) is None:
        return None
    return sympy.log(scale * c) + log1p(power / c)


# The smallest power these rules guard. A square overflows float32 only from |u| = 1.8e19
# (float64: 1.3e154), where data rarely is, and guarding it cost 4-5x eager autograd's time
# on every log(1 + y**2) (Blend at 1e6 float32: 28.7 ms against 6.0 ms); a fourth power
# overflows from 1.8e9 (issue 45's log(1 + x**4)). docs/stability.md lists the squares'
# range as a known limit.
_GUARDED_POWER = 3


def _large_power(term: sympy.Expr):
    """(k, u, p) for ``k*u**p`` with a number k > 0, an affine non-constant u and an integer
    p >= _GUARDED_POWER that is even or has u positive (so that k*u**p >= 0); else None."""
    k, power = term.as_coeff_Mul()
    u, p = power.as_base_exp()
    if not (k.is_positive and p.is_Integer and p >= _GUARDED_POWER and (p % 2 == 0 or u.is_positive)):
        return None
    if u.is_number or not _affine(u):
        return None
    return k, u, p


def _log1p_of_power(node: log1p):
    """``log1p(k*u**p)`` -> ``p*log(max(|u|/t, 1)) + log1p(min(v, 1/max(v, 1)))`` with ``v =
    k*u**p`` and ``k*t**p = 1``: the power overflows long before the log does, and
    ``log(1 + x**4)`` was inf in float32 from |x| = 1.4e10, where it is about 4*log(|x|).
    For |u| <= t this is log1p(v) as written; beyond, log(v) + log1p(1/v), two positive
    terms, and where v overflows 1/v is 0. No where: a comparison and a where cost more
    than the log1p (blend's forward and backward took 4x eager autograd's time with one).
    (1/max(v, 1), not 1/v: at u = 0 autograd's derivative of the untaken 1/v is inf, and
    0*inf = nan in double backward.)"""
    term = _large_power(node.args[0])
    if term is None:
        return None
    k, u, p = term
    t = k ** (-sympy.Integer(1) / p)
    v = node.args[0]
    return p * sympy.log(sympy.Max(sympy.Abs(u) / t, 1)) + log1p(sympy.Min(v, 1 / sympy.Max(v, 1)))


def _power_ratio(node: sympy.Mul):
    """``r*u**a*(c + k*u**p)**-m`` -> ``where(|u| < t, as written, r*u**(a - p*m)*(k +
    c*u**-p)**-m)`` with ``t = (c/k)**(1/p)``, for numbers c, k > 0 and integers a >= 0, m >=
    1: where the power overflows, the quotient as written is inf/inf = nan or 0 where it is
    moderate. The gradient of ``log(1 + x**4)``, ``4*x**3/(x**4 + 1)``, was 0 in float32 from
    |x| = 1.4e10 and nan from 7e12, where it is about 4/x. (Only for a >= 1 or k < 1:
    otherwise the quotient is below 1/k of the format's largest number where the power
    overflows, and so 0 or subnormal as written.)"""
    for f in node.args:
        base, minus_m = f.as_base_exp()
        if not (minus_m.is_Integer and minus_m < 0 and base.is_Add and len(base.args) == 2):
            continue
        c, power = base.as_coeff_Add()
        term = _large_power(power)
        if term is None or not c.is_positive:
            continue
        k, u, p = term
        m = -minus_m
        others = [g for g in node.args if g is not f]
        a = sum((g.as_base_exp()[1] for g in others if g.as_base_exp()[0] == u), sympy.Integer(0))
        if not (a.is_Integer and a >= 0) or a == 0 and k >= 1:
            continue
        rest = sympy.Mul(*(g for g in others if g.as_base_exp()[0] != u))
        t = (c / k) ** (sympy.Integer(1) / p)
        large = rest * u ** (a - p * m) * (k + c * u ** (-p)) ** (-m)
        return sympy.Piecewise((node, (u > -t) & (u < t)), (large, True))
    return None
