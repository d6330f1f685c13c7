"""Rules for the normal distribution's tails: ``log`` of ``ndtr``/``erfc``/``erf`` as
``log_ndtr``/``log_erf``, and products whose quadratic cancels as ``erfcx``.
"""

from __future__ import annotations

import sympy
from sympy.codegen.cfunctions import log1p

from ..math.functions import erfcx, log_erf, log_ndtr, ndtr
from .patterns import _exp_factors, _expand, _replace_each, _size, _SQRT2


def _rule_normal_tail(node: sympy.Expr):
    """``log(c*ndtr(u))`` and ``log(c*erfc(u))`` as ``log_ndtr`` (see :mod:`symgrad.rewrite`).

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
    from u = 14 in float32 that way), and whose ``exp`` amplifies the
    rounding of a scaled argument (ndtr's 1/sqrt(2), or the user's) by ``2*u**2`` (130
    float64 ulps of the probit gradient at u = 20, where the quotient as written is exact;
    ``exp(x**2/2)*erfc(x/sqrt(2))/2`` as ``erfcx`` alone was 515 ulps off at x = -25.5,
    where the product is 2.7).
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
