"""SymPy functions with numerically stable torch kernels, for :mod:`symgrad.stable`.

Each is a :class:`sympy.Function` with an exact ``fdiff`` (so gradients and double
gradients stay symbolic and correct), an mpmath implementation (``_imp_``, which
``lambdify(..., "mpmath")`` and ``evalf`` use), and a torch spelling in
:data:`symgrad.printer.PRINTERS` (or, for the generated families below, a ``torch_code``
method the printer calls).

- ``softplus(u) = log(1 + exp(u))``            -> ``torch.nn.functional.softplus``
- ``sigmoid(u) = 1 / (1 + exp(-u))``           -> ``torch.sigmoid``
- ``mish(u) = u*tanh(softplus(u))``, ``silu(u) = u*sigmoid(u)`` and
  ``log_sigmoid(u) = -softplus(-u)``           -> ``torch.nn.functional.mish``, ``silu``
  and ``logsigmoid``: forward bodies only (kernels.FORWARD_KERNELS)
- ``logaddexp(a, b) = log(exp(a) + exp(b))``   -> ``torch.logaddexp``
- ``hypot(a, b) = sqrt(a**2 + b**2)``          -> ``torch.hypot``
- ``norm_ratio(a, n) = a/n`` (n a norm of a)    -> ``a / n``, kept whole
- ``hypot_excess(a, b) = hypot(a, b) - b``      -> ``a*(a/(torch.hypot(a, b) + b))`` (b > 0)
- ``hypot_plus(u, b) = hypot(u, b) + u``        -> ``b*(b/(torch.hypot(u, b) + |u|)) + u*(1 + sign(u))``
- ``xlogy(x, y) = x*log(y)`` (0 where x = 0)   -> ``torch.xlogy``
- ``ndtr(u) = (1 + erf(u/sqrt(2)))/2``          -> ``0.5*torch.special.erfc(-u/sqrt(2))``
- ``log_ndtr(u) = log(ndtr(u))``                -> ``torch.special.log_ndtr``
- ``erfcx(u) = exp(u**2)*erfc(u)``              -> ``torch.special.erfcx``
  (these two through module-level helpers, ``printer.HELPERS``: ATen has no
  float16 or bfloat16 kernel for them)
- ``log_sinh(u) = log(sinh(u))`` (u > 0)       -> ``u - log(2) + log(-expm1(-2u))``
- ``log1mexp(u) = log(1 - exp(u))`` (u < 0)     -> ``log(-expm1(u))`` above -log(2),
  ``log1p(-exp(u))`` below (Maechler's switch)
- ``log_erf(u) = log(erf(u))`` (u > 0)          -> ``log1p(-erfc(u))`` above 1/2, ``log(erf(u))``
  below
- ``power_excess(u, a, p) = (a + u)**p - a**p`` -> ``a**p*expm1(p*log1p(u/a))`` where
  ``|p*log1p(u/a)| <= max(1, |p|/2)``, as written elsewhere
- ``finite(u) = u``                             -> ``torch.nan_to_num(u, nan=torch.nan)``: inf as the
  dtype's largest number
- ``guard(x, cond, safe, earlier)``: ``x`` where ``cond`` holds and ``earlier`` does not,
  else ``safe``: the inner half of the "double where", which cuts an untaken Piecewise
  branch off from ``x``.
- :func:`removable`: ``f(x)`` with a removable singularity at 0 (``sin(x)/x``) or at a
  dyadic center (``log(x)/(x - 1)`` at 1), printed as a Taylor polynomial near it and the
  closed form elsewhere, each at a guarded argument.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
from typing import Callable

import mpmath
import sympy
from sympy.core.function import ArgumentIndexError
from sympy.printing.precedence import PRECEDENCE

from .numbers import numbers_to_floats
from .probe import REMEMBERED

# The mpmath implementations below call these (probe.remembered): probes meet a constant such
# as ndtr(30) at every point, and each costs tens of milliseconds at 2048 bits.
_erf, _erfc, _ncdf = REMEMBERED["erf"], REMEMBERED["erfc"], REMEMBERED["ncdf"]


def _mp(value):
    """An mpmath number from a SymPy number or a Python/mpmath number."""
    if isinstance(value, sympy.Basic):
        value = sympy.N(value, mpmath.mp.dps + 5)
        if value.is_real:
            return mpmath.mpf(value._to_mpmath(mpmath.mp.prec))
        re, im = value.as_real_imag()
        return mpmath.mpc(sympy.Float(re)._to_mpmath(mpmath.mp.prec), sympy.Float(im)._to_mpmath(mpmath.mp.prec))
    return mpmath.mpmathify(value)


class StableFunction(sympy.Function):
    """Base: real for real arguments, numeric evaluation through ``_imp_``."""

    #: positions of arguments that must be tensors in torch (a number becomes a 0-d tensor)
    tensor_args: tuple[int, ...] = ()
    #: whether the torch spelling keeps an integer or bool tensor's dtype (numbers_to_floats
    #: then keeps a unit Float coefficient, which makes the product floating)
    keeps_dtype: bool = False

    def _eval_is_extended_real(self):
        return True if all(a.is_extended_real for a in self.args if isinstance(a, sympy.Expr)) else None

    def _eval_is_finite(self):
        return None

    def _eval_evalf(self, prec):
        if not all(isinstance(a, sympy.Expr) and a.is_number for a in self.args):
            return None
        with mpmath.workprec(prec + 30):
            value = type(self)._imp_(*[_mp(a) for a in self.args])
        with mpmath.workprec(prec):
            if isinstance(value, mpmath.mpc):
                return sympy.Float(value.real, precision=prec) + sympy.I * sympy.Float(value.imag, precision=prec)
            return sympy.Float(value, precision=prec)

    def elementary(self) -> sympy.Expr:
        """The same function in SymPy's elementary functions (for series and tests)."""
        raise NotImplementedError


class softplus(StableFunction):  # noqa: N801 (SymPy's naming)
    """``log(1 + exp(u))``."""

    nargs = 1

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        if isinstance(u, mpmath.mpf) and u > 0:
            return u + mpmath.log1p(mpmath.exp(-u))
        return mpmath.log1p(mpmath.exp(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sigmoid(self.args[0])

    def _eval_is_positive(self):
        return True if self.args[0].is_extended_real else None

    def elementary(self):
        return sympy.log(1 + sympy.exp(self.args[0]))


class sigmoid(StableFunction):  # noqa: N801
    """``1 / (1 + exp(-u))``."""

    nargs = 1

    @classmethod
    def eval(cls, u):
        if u == 0:
            return sympy.S.Half

    @staticmethod
    def _imp_(u):
        return 1 / (1 + mpmath.exp(-mpmath.mpmathify(u)))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        return sigmoid(u) * sigmoid(-u)

    def _eval_is_positive(self):
        return True if self.args[0].is_extended_real else None

    def elementary(self):
        return 1 / (1 + sympy.exp(-self.args[0]))


class ForwardKernel(StableFunction):
    """Base of the functions that only a forward body calls: each is what one ATen
    activation kernel computes (kernels.FORWARD_KERNELS rewrites its formula into it, after
    the gradients are derived). Never parsed from user input."""

    nargs = 1


class mish(ForwardKernel):  # noqa: N801
    """``u*tanh(softplus(u))``."""

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        return u * mpmath.tanh(softplus._imp_(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        t = sympy.tanh(softplus(u))
        return t + u * sigmoid(u) * (1 - t**2)

    def elementary(self):
        u = self.args[0]
        return u * sympy.tanh(sympy.log(1 + sympy.exp(u)))


class silu(ForwardKernel):  # noqa: N801
    """``u*sigmoid(u)``."""

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        return u * sigmoid._imp_(u)

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        # (as derive writes SiLU's gradient: kernels.KERNELS matches silu_backward against this)
        return sigmoid(u) * (1 + u * (1 - sigmoid(u)))

    def elementary(self):
        u = self.args[0]
        return u / (1 + sympy.exp(-u))


class log_sigmoid(ForwardKernel):  # noqa: N801
    """``-softplus(-u)``, that is ``log(sigmoid(u))``."""

    @staticmethod
    def _imp_(u):
        return -softplus._imp_(-mpmath.mpmathify(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sigmoid(-self.args[0])

    def _eval_is_positive(self):
        return False if self.args[0].is_extended_real else None

    def elementary(self):
        return -sympy.log(1 + sympy.exp(-self.args[0]))


class ndtr(StableFunction):  # noqa: N801
    """The standard normal CDF ``(1 + erf(u/sqrt(2)))/2``, accurate in both tails.

    SymPy rewrites ``erfc(-u)`` to ``2 - erfc(u)``, which cancels for large ``u``; this
    function keeps the tail form (``torch.special.ndtr`` uses ``erfc`` there).
    """

    nargs = 1

    @classmethod
    def eval(cls, u):
        if u == 0:
            return sympy.S.Half

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        return _erfc(-u / mpmath.sqrt(2)) / 2

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        return sympy.exp(-(u**2) / 2) / sympy.sqrt(2 * sympy.pi)

    def _eval_is_positive(self):
        return True if self.args[0].is_extended_real else None

    def elementary(self):
        return (1 + sympy.erf(self.args[0] / sympy.sqrt(2))) / 2


# Above this, erfcx's mpmath value comes from its asymptotic series (8 terms: relative
# error below 1e-60), since exp(u**2)*erfc(u) would need about 2*log2(u) extra bits.
_ERFCX_ASYMPTOTIC = 1e4


class erfcx(StableFunction):  # noqa: N801
    """The scaled complementary error function ``exp(u**2)*erfc(u)``.

    As written, ``exp(u**2)`` overflows from u = 9.4 in float32 while ``erfc(u)``
    underflows from 10: inf*0 = NaN where the product is about ``1/(u*sqrt(pi))``.
    ``torch.special.erfcx`` computes it directly.
    """

    nargs = 1
    tensor_args = (0,)

    @classmethod
    def eval(cls, u):
        if u == 0:
            return sympy.Integer(1)

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        if isinstance(u, mpmath.mpf) and u > _ERFCX_ASYMPTOTIC:
            # 1/(u*sqrt(pi)) * sum((-1)**n * (2n - 1)!! / (2u**2)**n)
            step, term, total = 1 / (2 * u * u), mpmath.mpf(1), mpmath.mpf(1)
            for n in range(1, 9):
                term *= -(2 * n - 1) * step
                total += term
            return total / (u * mpmath.sqrt(mpmath.pi))
        extra = 2 * abs(mpmath.mag(u)) + 10 if isinstance(u, mpmath.mpf) and u else 10
        with mpmath.extraprec(extra):  # (exp of u**2 loses log2(u**2) bits of u**2's rounding)
            return +(mpmath.exp(u * u) * _erfc(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        return 2 * u * self - 2 / sympy.sqrt(sympy.pi)

    def _eval_is_positive(self):
        return True if self.args[0].is_real else None  # (not at oo, where it is 0)

    def elementary(self):
        u = self.args[0]
        return sympy.exp(u**2) * sympy.erfc(u)


class log_ndtr(StableFunction):  # noqa: N801
    """``log(ndtr(u))``, the log of the standard normal CDF (the probit log-likelihood).

    As written, ``ndtr(u)`` underflows from u = -14 in float32 (log(0) = -inf where the
    value is about ``-u**2/2``), and its derivative ``pdf(u)/ndtr(u)`` is 0/0 from u = -14.
    ``torch.special.log_ndtr`` is accurate in both tails; stable writes the derivative as
    ``sqrt(2/pi)/erfcx(-u/sqrt(2))`` below 0, exact where torch's own backward,
    ``exp(-u**2/2 - log_ndtr(u))/sqrt(2*pi)``, cancels (relative error 5.5 at u = -1e4 in float32).
    """

    nargs = 1
    tensor_args = (0,)

    @classmethod
    def eval(cls, u):
        if u == 0:
            return -sympy.log(2)

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        if isinstance(u, mpmath.mpf) and u > 0:
            return mpmath.log1p(-_ncdf(-u))  # (log(1 - tiny) needs the log1p)
        return mpmath.log(_erfc(-u / mpmath.sqrt(2)) / 2)

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        cdf = ndtr(self.args[0])
        # pdf(u)/ndtr(u), 0/0 in float32 from u = -14: stable._normal_tail_products writes it
        # as sqrt(2/pi)/erfcx(-u/sqrt(2)) for u < 0
        return cdf.fdiff() / cdf

    def _eval_is_negative(self):
        return True if self.args[0].is_real else None  # (not at oo, where it is 0)

    def elementary(self):
        return sympy.log((1 + sympy.erf(self.args[0] / sympy.sqrt(2))) / 2)


class logaddexp(StableFunction):  # noqa: N801
    """``log(exp(a) + exp(b))``."""

    nargs = 2
    tensor_args = (0, 1)

    @classmethod
    def eval(cls, a, b):
        if a == 0:
            return softplus(b)
        if b == 0:
            return softplus(a)

    @staticmethod
    def _imp_(a, b):
        a, b = mpmath.mpmathify(a), mpmath.mpmathify(b)
        if isinstance(a, mpmath.mpf) and isinstance(b, mpmath.mpf):
            hi, lo = (a, b) if a >= b else (b, a)
            return hi + mpmath.log1p(mpmath.exp(lo - hi))
        return mpmath.log(mpmath.exp(a) + mpmath.exp(b))

    def fdiff(self, argindex=1):
        a, b = self.args
        if argindex == 1:
            return sigmoid(a - b)
        if argindex == 2:
            return sigmoid(b - a)
        raise ArgumentIndexError(self, argindex)

    def elementary(self):
        a, b = self.args
        return sympy.log(sympy.exp(a) + sympy.exp(b))


class hypot(StableFunction):  # noqa: N801
    """``sqrt(a**2 + b**2)``."""

    nargs = 2
    tensor_args = (0, 1)

    @staticmethod
    def _imp_(a, b):
        a, b = mpmath.mpmathify(a), mpmath.mpmathify(b)
        if isinstance(a, mpmath.mpf) and isinstance(b, mpmath.mpf):
            return mpmath.hypot(a, b)
        return mpmath.sqrt(a**2 + b**2)

    def fdiff(self, argindex=1):
        if argindex not in (1, 2):
            raise ArgumentIndexError(self, argindex)
        return self.args[argindex - 1] / self

    def _eval_is_nonnegative(self):
        return True if all(a.is_extended_real for a in self.args) else None

    def elementary(self):
        a, b = self.args
        return sympy.sqrt(a**2 + b**2)


def hypot_order(arg: sympy.Expr) -> tuple:
    """The sort key of hypot's arguments: numbers last, the rest in SymPy's order
    (stable._rule_hypot nests them in it; hypot_plus.root builds the same root)."""
    return (bool(arg.is_number), sympy.default_sort_key(arg))


class norm_ratio(StableFunction):  # noqa: N801
    """``a/n``, a component ``a`` of a norm ``n`` (``hypot``) over that norm: at most 1 in
    magnitude, so it neither overflows nor underflows where ``a`` and ``n`` are finite.

    It exists to keep the quotient whole: SymPy merges ``(a/n)**2/n`` back into
    ``a**2*n**-3``, which overflows and underflows in float32 where the norm is beyond 7e12
    or below 1.4e-13 (``hypot``'s second derivatives; stable._rule_norm_ratio).
    """

    nargs = 2

    @staticmethod
    def _imp_(a, n):
        return mpmath.mpmathify(a) / mpmath.mpmathify(n)

    def fdiff(self, argindex=1):
        a, n = self.args
        if argindex == 1:
            return 1 / n
        if argindex == 2:
            return -self / n
        raise ArgumentIndexError(self, argindex)

    def elementary(self):
        a, n = self.args
        return a / n

    def _sympystr(self, printer) -> str:
        # Docstrings show the quotient, parenthesised: SymPy gives a call an atom's precedence.
        a, n = self.args
        over = printer.parenthesize(a, PRECEDENCE["Mul"]), printer.parenthesize(n, PRECEDENCE["Mul"], strict=True)
        return "(%s/%s)" % over


class ExpandedFunction(StableFunction):
    """Base of the one-argument functions printed as an expression of SymPy functions
    (:meth:`expanded`, a Piecewise of forms each accurate where it is taken).

    The plan expands them before CSE (expand_functions), so that their argument and
    conditions are computed once; printed on their own they repeat the argument.
    """

    nargs = 1

    @classmethod
    def expanded(cls, *args: sympy.Expr) -> sympy.Expr:
        raise NotImplementedError

    @classmethod
    def torch_code(cls, printer, args: list[str], values: tuple[sympy.Expr, ...] = ()) -> str:
        """:meth:`expanded`, printed with the arguments' code (``values``: the arguments
        themselves; a number among them is passed as it is, as power_excess's bounds need)."""
        values = values or (None,) * len(args)
        placeholders = [
            v if v is not None and v.is_number else sympy.Dummy(f"argument{i}", real=True) for i, v in enumerate(values)
        ]
        names = {p: text for p, text in zip(placeholders, args) if not p.is_number}
        bound = printer.__class__({**printer._names, **names}, printer._reference, printer._compiled, printer._promote)
        return bound.doprint(numbers_to_floats(cls.expanded(*placeholders)))


def expand_functions(expr: sympy.Expr) -> sympy.Expr:
    """Each ExpandedFunction (a Removable, log1mexp, hypot_plus) in ``expr`` as its
    Piecewise: what the code computes. The plan expands them before CSE, so that CSE shares
    the mask and the guarded arguments (printed on its own, a Removable repeats them in
    every term); the probes, so that they see the float arithmetic of each branch."""
    return expr.replace(lambda node: isinstance(node, ExpandedFunction), lambda node: type(node).expanded(*node.args))


class log1mexp(ExpandedFunction):  # noqa: N801
    """``log(1 - exp(u))`` for ``u < 0``, accurate at every such u (M. Maechler, "Accurately
    computing log(1 - exp(-|a|))", 2012).

    ``log(-expm1(u))`` is 0 in float32 once ``expm1(u)`` rounds to -1 (u < -17), where the
    value is about ``-exp(u)``; ``log1p(-exp(u))`` keeps that, but cancels near 0, where
    ``exp(u)`` is near 1. So the first is used above ``u = -log(2)``, the second below. At
    ``u >= 0`` both are undefined, as the function is, so neither branch needs a guard.
    """

    SWITCH = -math.log(2)

    @classmethod
    def _imp_(cls, u):
        u = mpmath.mpmathify(u)
        # (the printed arithmetic, so that a probe at float32 precision sees what runs)
        if isinstance(u, mpmath.mpf) and u <= cls.SWITCH:
            return mpmath.log1p(-mpmath.exp(u))
        return mpmath.log(-mpmath.expm1(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        from sympy.codegen.cfunctions import expm1

        # d/du log(1 - exp(u)) = -exp(u)/(1 - exp(u)) = -1/(exp(-u) - 1)
        return -1 / expm1(-self.args[0])

    def _eval_is_extended_real(self):
        return None  # real only for u < 0

    def elementary(self):
        return sympy.log(1 - sympy.exp(self.args[0]))

    @classmethod
    def expanded(cls, u: sympy.Expr) -> sympy.Expr:
        """The two forms as a Piecewise, which the plan expands before CSE (so that ``u``
        is computed once)."""
        from sympy.codegen.cfunctions import expm1, log1p

        return sympy.Piecewise(
            (sympy.log(-expm1(u)), u > sympy.Float(cls.SWITCH)),
            (log1p(-sympy.exp(u)), True),
        )


class log_sinh(ExpandedFunction):  # noqa: N801
    """``log(sinh(u))`` for ``u > 0``, computed as ``u - log(2) + log(-expm1(-2u))``.

    As written, sinh overflows from ``u = 89`` in float32 (710 in float64), where the log is
    ``u - log(2)``: the von Mises-Fisher log-normaliser ``log(k) - log(sinh(k))`` was -inf
    there (found by an accuracy hunt). ``-expm1(-2u)`` keeps ``2u`` near 0, where the log
    carries the value; for large ``u`` it rounds to 1, and its log's ``-exp(-2u)`` is below
    the rounding of ``u`` anyway. (Not log1mexp(-2u), whose switch is for a log that is the
    whole value: its where and ``log1p`` of tiny numbers, slow in ATen, made a forward plus
    backward 4x as slow as sinh and log; this costs as much as they do.) At ``u <= 0`` it is
    nan or -inf, as the log of sinh is.
    """

    @staticmethod
    def _imp_(u):
        u = mpmath.mpmathify(u)
        return u - mpmath.log(2) + mpmath.log(-mpmath.expm1(-2 * u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return 1 / sympy.tanh(self.args[0])

    def _eval_is_extended_real(self):
        return None  # real only for u > 0

    def elementary(self):
        return sympy.log(sympy.sinh(self.args[0]))

    @classmethod
    def expanded(cls, u: sympy.Expr) -> sympy.Expr:
        from sympy.codegen.cfunctions import expm1

        return u - sympy.log(2) + sympy.log(-expm1(-2 * u))


class log_erf(ExpandedFunction):  # noqa: N801
    """``log(erf(u))`` for ``u > 0``: ``log1p(-erfc(u))`` above ``u = 1/2``, as written below.

    As written ``erf(u)`` rounds to 1 from u = 4 in float32 (6 in float64), where the log
    is about ``-erfc(u)``: ``log(erf(x))`` (the half-normal log CDF at ``x*sqrt(2)``) was 0
    at x = 5, where it is -1.5e-12 (a third accuracy hunt). ``log1p(-erfc(u))`` keeps that
    but cancels near 0, where ``erfc(u)`` is near 1; at the switch ``erfc(1/2)`` is 0.48,
    whose ``log1p`` does not cancel, and below it ``erf(u)`` is exact. At ``u <= 0`` it is
    nan or -inf, as the log of erf is. (Only the value has the where: the derivative
    ``2*exp(-u**2)/(sqrt(pi)*erf(u))`` is exact on both sides.)
    """

    SWITCH = 0.5

    @classmethod
    def _imp_(cls, u):
        u = mpmath.mpmathify(u)
        # (the printed arithmetic, so that a probe at float32 precision sees what runs)
        if isinstance(u, mpmath.mpf) and u > cls.SWITCH:
            return mpmath.log1p(-_erfc(u))
        return mpmath.log(_erf(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u = self.args[0]
        return 2 * sympy.exp(-(u**2)) / (sympy.sqrt(sympy.pi) * sympy.erf(u))

    def _eval_is_extended_real(self):
        return None  # real only for u > 0

    def elementary(self):
        return sympy.log(sympy.erf(self.args[0]))

    @classmethod
    def expanded(cls, u: sympy.Expr) -> sympy.Expr:
        from sympy.codegen.cfunctions import log1p

        return sympy.Piecewise(
            (log1p(-sympy.erfc(u)), u > sympy.Float(cls.SWITCH)),
            (sympy.log(sympy.erf(u)), True),
        )


def _dyadic_toward_zero(value: mpmath.mpf, bits: int = 6) -> sympy.Rational:
    """``value`` rounded toward 0 to ``bits`` significant bits: a number a float holds
    exactly, the same on every machine."""
    if value == 0:
        return sympy.S.Zero
    shift = bits - int(mpmath.frexp(abs(value))[1])
    steps = int(mpmath.floor(mpmath.ldexp(abs(value), shift)))
    return sympy.Rational(steps if value > 0 else -steps) * sympy.Rational(2) ** -shift


class power_excess(ExpandedFunction):  # noqa: N801
    """``(a + u)**p - a**p`` for numbers ``a > 0`` and ``p``, or ``a != 0`` and an integer
    ``p`` (stable._rule_power_minus_value, for the exponents that have no polynomial of
    their own, and in derivative formulas those with sums of roots, whose autograd
    derivative is not exact): ``a**p*expm1(p*log1p(u/a))`` where ``|p*log1p(u/a)| <= R``,
    ``R = max(1, |p|/2)``, and as written elsewhere.

    As written the power rounds to ``a**p`` near ``u = 0``, and the difference to 0:
    Barron's robust loss ``2*((1 + x**2/2)**0.25 - 1)`` was 0 in float32 at x = 1e-4 (a
    fourth accuracy hunt), and ``1/sqrt(1 + x**2) - 1`` too. The expm1 form is exact
    there, but the rounding of its argument ``w = p*log1p(u/a)``, about ``2|w|`` ulps of
    the value, grows far from 0: ``(1 + x)**7.5 - 1`` was 5.4e-6 off at x = 1e4 in float32.
    As written, the rounding of ``a + u`` costs about ``|p|/2`` ulps of the power, and
    where ``|w| >= 1`` the difference loses at most a factor e/(e - 1) more: so the switch
    is where both are about ``|p|`` ulps or less (at ``|w| = 1`` it cost 30 ulps for p =
    20.5; found in review). The switch points are dyadic, just inside that range, and
    absent where it reaches u = -a or u beyond 2**1000 (the expm1 form's limits there are
    the values: ``-a**p`` or inf at u = -a, inf or 0 minus ``a**p`` at u = inf; a cap at
    -63a/64 left ``(1 + x)**0.001 - 1`` 7e-6 off at x = -0.9865 as written). The expm1 form's
    argument is guarded: where that form is not taken, log1p may be nan (u < -a) and expm1
    overflow (the double where).
    """

    nargs = 3

    @staticmethod
    def bounds(a: sympy.Expr, p: sympy.Expr) -> tuple[sympy.Expr | None, sympy.Expr | None]:
        """The range of ``u`` where the expm1 form is taken, ``|p*log1p(u/a)| <= R``,
        rounded inward; None for a side without a bound."""
        with mpmath.workprec(80):
            magnitude = abs(_mp(p))
            reach = max(mpmath.mpf(1), magnitude / 2) / magnitude  # (the bound on |log1p(u/a)|)
            lowest, highest = mpmath.expm1(-reach), mpmath.expm1(reach)
            low = None if lowest < mpmath.mpf(-63) / 64 else _dyadic_toward_zero(lowest)
            high = None if highest > mpmath.mpf(2) ** 1000 else _dyadic_toward_zero(highest)
        ends = [None if t is None else a * t for t in (low, high)]
        return (ends[0], ends[1]) if a.is_positive else (ends[1], ends[0])

    @classmethod
    def _imp_(cls, u, a, p):
        u, a, p = mpmath.mpmathify(u), mpmath.mpmathify(a), mpmath.mpmathify(p)
        low, high = (None if b is None else _mp(b) for b in cls.bounds(sympy.Float(a, 30), sympy.Float(p, 30)))
        # (the printed arithmetic, so that a probe at float32 precision sees what runs)
        if isinstance(u, mpmath.mpf) and (low is None or u >= low) and (high is None or u <= high):
            return a**p * mpmath.expm1(p * mpmath.log1p(u / a))
        return (a + u) ** p - a**p

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        u, a, p = self.args
        return p * (a + u) ** (p - 1)

    def _eval_is_extended_real(self):
        return None  # real for u > -a (and everywhere for an integer p)

    def elementary(self):
        u, a, p = self.args
        return (a + u) ** p - a**p

    @classmethod
    def expanded(cls, u: sympy.Expr, a: sympy.Expr, p: sympy.Expr) -> sympy.Expr:
        from sympy.codegen.cfunctions import expm1, log1p

        low, high = cls.bounds(a, p)
        # (a bound that u cannot cross is left out: hypot_excess(x, b) >= 0 needs no low one)
        sides = [] if low is None or (u.is_nonnegative and low <= 0) else [u >= low]
        sides += [] if high is None or (u.is_nonpositive and high >= 0) else [u <= high]
        near = sympy.And(*sides)
        closeness = a**p * expm1(p * log1p(guard(u, near, sympy.S.Zero) / a))
        return sympy.Piecewise((closeness, near), ((a + u) ** p - a**p, True))


class finite(StableFunction):  # noqa: N801
    """``u`` itself, where an infinite ``u`` is printed as the largest finite number of its
    dtype (``torch.nan_to_num``, nan kept): so that ``finite(u)/finite(a + u)`` is 1 where
    ``u`` overflows, as the difference it replaces, ``1 - a/(a + u)``, was; inf/inf is nan
    (stable._rule_power_minus_value: ``1/(1 + x**2) - 1`` as ``-x**2/(1 + x**2)``, nan from
    |x| = 1.9e19 in float32; found in review).
    """

    nargs = 1
    keeps_dtype = True

    @staticmethod
    def _imp_(u):
        return mpmath.mpmathify(u)

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.S.One

    def elementary(self):
        return self.args[0]


class hypot_excess(StableFunction):  # noqa: N801
    """``hypot(a, b) - b`` for a number ``b > 0``, computed as
    ``a*((a/2)/(hypot(a, b)/2 + b/2))``, which is ``a**2/(hypot(a, b) + b)``.

    As written it cancels where ``|a|`` is small next to ``b``: the pseudo-Huber loss
    ``sqrt(1 + x**2) - 1`` is 0 in float32 below ``|x|`` = 2.4e-4, where it is ``x**2/2``.
    The quotient lies in (-1, 1), so unlike ``a**2`` (float16 overflows from ``|a|`` = 256)
    it cannot overflow; the halves keep the denominator finite wherever ``hypot(a, b)`` is
    (float16's 65504 plus b overflowed; found in review). At ``a = +-inf`` the quotient is
    inf/inf: NaN, where the difference is inf.
    """

    nargs = 2

    @staticmethod
    def _imp_(a, b):
        a, b = mpmath.mpmathify(a), mpmath.mpmathify(b)
        if isinstance(a, mpmath.mpf) and isinstance(b, mpmath.mpf):
            total = mpmath.hypot(a, b) + b
            # (the quotient form, so that a probe at float32 precision sees the printed
            # arithmetic and not a cancellation the generated code does not make)
            return a * (a / total) if total else mpmath.hypot(a, b) - b
        return mpmath.sqrt(a**2 + b**2) - b

    def fdiff(self, argindex=1):
        a, b = self.args
        if argindex == 1:
            return a / hypot(a, b)
        if argindex == 2:
            return -self / hypot(a, b)  # b/hypot(a, b) - 1, without its cancellation
        raise ArgumentIndexError(self, argindex)

    def _eval_is_nonnegative(self):
        a, b = self.args
        return True if a.is_extended_real and b.is_nonnegative else None

    def elementary(self):
        a, b = self.args
        return sympy.sqrt(a**2 + b**2) - b


class hypot_plus(ExpandedFunction):  # noqa: N801
    """``hypot(u, b) + u``, computed as ``b*(b/(hypot(u, b) + |u|)) + u*(1 + sign(u))``:
    the quotient is ``hypot(u, b) - |u|``, and ``u*(1 + sign(u))`` is ``2u`` where
    ``u > 0`` and exactly 0 elsewhere. (Not ``u + |u|``, which is the same: SymPy would
    spread it into the sum, and its terms could then be added in an order that cancels.)

    ``b`` is a nonzero number (stable._hypot_sum): at ``b = u = 0`` the quotient would be
    0/0. As written it cancels where ``u`` is negative and large next to ``b``: squareplus
    ``(x + sqrt(x**2 + 4))/2`` was 0 in float32 from ``x = -1e4`` (truth 1e-4), and
    ``sqrt(x**2 + 1) - x``, which is ``hypot_plus(-x, 1)``, from ``x = 4096``. No term
    cancels here, and every one is finite with finite derivatives wherever ``2u`` is (it
    is about the value), so no ``torch.where`` is needed (a guarded Piecewise made squareplus's forward plus
    backward 10x slower, and a where of the two forms 4x). At ``u = 0`` autograd's
    derivatives of ``|u|`` and ``sign(u)`` are 0, which leaves the right slope, 1.
    The quotient is ``b*(b/(...))``, kept whole by stable_functions.norm_ratio, so
    ``b**2`` is never formed: it would overflow in float16 from ``b = 256``.
    """

    nargs = 2

    @staticmethod
    def root(u: sympy.Expr, b: sympy.Expr) -> hypot:
        """``hypot(u, b)``, without a minus sign and with its arguments in the order
        stable._rule_hypot gives them, the number ``b`` last (hypot is even in each, and
        symmetric), so that ``hypot_plus(-x, 1)`` and the gradients' ``hypot(x, 1)`` share
        one kernel."""
        unsigned = (-arg if arg.could_extract_minus_sign() else arg for arg in (u, b))
        return hypot(*sorted(unsigned, key=hypot_order))

    @staticmethod
    def _imp_(u, b):
        u, b = mpmath.mpmathify(u), mpmath.mpmathify(b)
        if isinstance(u, mpmath.mpf) and isinstance(b, mpmath.mpf):
            # (the printed arithmetic, so that a probe at float32 precision sees what runs)
            return b * (b / (mpmath.hypot(u, b) + abs(u))) + (2 * u if u > 0 else 0)
        return mpmath.sqrt(u**2 + b**2) + u

    def fdiff(self, argindex=1):
        u, b = self.args
        if argindex == 1:
            return self / self.root(u, b)  # u/hypot(u, b) + 1, without its cancellation
        if argindex == 2:
            return b / self.root(u, b)
        raise ArgumentIndexError(self, argindex)

    def _eval_is_nonnegative(self):
        return True if all(a.is_extended_real for a in self.args) else None

    def elementary(self):
        u, b = self.args
        return sympy.sqrt(u**2 + b**2) + u

    @classmethod
    def expanded(cls, u: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        return b * norm_ratio(b, cls.root(u, b) + sympy.Abs(u)) + u * (1 + sympy.sign(u))


class xlogy(StableFunction):  # noqa: N801
    """``x*log(y)``, defined as 0 where ``x == 0`` (the limit for ``x*log(x)``)."""

    nargs = 2

    @staticmethod
    def _imp_(x, y):
        x, y = mpmath.mpmathify(x), mpmath.mpmathify(y)
        if x == 0:
            return mpmath.mpf(0)
        return x * mpmath.log(y)

    def fdiff(self, argindex=1):
        x, y = self.args
        if argindex == 1:
            return sympy.log(y)
        if argindex == 2:
            return x / y
        raise ArgumentIndexError(self, argindex)

    def elementary(self):
        x, y = self.args
        return x * sympy.log(y)


class guard(StableFunction):  # noqa: N801
    """``x`` where ``cond`` holds and ``earlier`` does not, else ``safe`` (a value of ``x``
    at which the guarded expression is finite where one is found: one at which ``cond``
    holds, a number or an expression in the other symbols of ``cond``, or a number found by
    probing; else 1/2).

    Substituted for a symbol inside a Piecewise branch, with the branch's condition and
    the earlier branches' conditions (``earlier``, their Or; absent for the first branch),
    it is ``x`` exactly where the branch is taken, and cuts the branch off from ``x``
    elsewhere: its own torch.where's backward passes 0 there, whatever the branch's
    backward made of the outer where's zero (the "double where"). ``earlier`` is printed
    negated with ``~``, as the nested torch.where that selects the branch treats it: where
    an earlier condition is nan (log(x) > 1 at x < 0) it does not hold, while SymPy's own
    negation, log(x) <= 1, would not hold either (found in review).
    """

    nargs = (3, 4)
    keeps_dtype = True

    @classmethod
    def eval(cls, x, cond, safe, earlier=None):
        if earlier is sympy.true or cond is sympy.false:
            return safe
        if earlier in (None, sympy.false) and cond is sympy.true:
            return x
        if earlier is sympy.false:
            return cls(x, cond, safe)  # no earlier branch: the three-argument form

    @staticmethod
    def _imp_(x, cond, safe, earlier=False):
        return x if cond and not earlier else mpmath.mpmathify(safe)

    def _eval_evalf(self, prec):
        return None

    def _eval_derivative(self, s):
        # The conditions are not differentiated (SymPy cannot): they are piecewise constant.
        x, cond, safe, earlier = (*self.args, sympy.false)[:4]
        dx, dsafe = x.diff(s), safe.diff(s)
        if dx == 0 and dsafe == 0:
            return sympy.Integer(0)
        # (In this order, no condition is negated: see the class docstring.)
        return sympy.Piecewise((dsafe, earlier), (dx, cond), (dsafe, True))

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def elementary(self):
        x, cond, safe, earlier = (*self.args, sympy.false)[:4]
        return sympy.Piecewise((safe, earlier), (x, cond), (safe, True))


def to_elementary(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with every stable function replaced by its elementary definition."""
    return expr.replace(lambda e: isinstance(e, StableFunction), lambda e: e.elementary())


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
    outermost (:func:`_polynomial_text`).
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
    def torch_code(cls, printer, args: list[str], values: tuple[sympy.Expr, ...] = ()) -> str:
        (x,) = args
        return _polynomial_text(cls.coeffs, x)


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


def _polynomial_text(coeffs: tuple[float, ...], x: str) -> str:
    """``x * (x * (c3 * x + c2) + c1) + c0``, Horner's scheme over the coefficients: a
    multiply and an add a degree, which the in-place pass makes one chain on the innermost
    product's buffer, ``(c3 * x).add_(c2).mul_(x).add_(c1)...`` (a number written first,
    ``c2 + c3 * x``, would allocate again: a number minus a tensor has no in-place form)."""
    if not x.isidentifier():
        x = f"({x})"
    degree = max((n for n, c in enumerate(coeffs) if c), default=None)
    if degree is None:
        return f"0.0 * {x}"
    text = repr(coeffs[degree])
    for n in range(degree - 1, -1, -1):
        text = f"{text} * {x}" if n == degree - 1 else f"{x} * ({text})"
        if coeffs[n] > 0:
            text = f"{text} + {coeffs[n]!r}"
        elif coeffs[n] < 0:
            text = f"{text} - {-coeffs[n]!r}"
    return text


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
                # -1/8, and (1 + x)**(1/x) was 1 there, where it is e; an accuracy hunt.)
                return False
            continue
        if isinstance(node, (softplus, sigmoid, ndtr, erfcx, log_ndtr, logaddexp, xlogy, expm1, log1p) + _ANALYTIC):
            continue
        if isinstance(node, Removable):
            continue
        if isinstance(node, (hypot, hypot_excess)) and any(a.is_number and a.is_nonzero for a in node.args):
            # sqrt(x**2 + b**2), b != 0: analytic near 0 (asinh(x)/x's gradient, (1/hypot(x, 1)
            # - asinh(x)/x)/x, was 0 in float32 below |x| = 1e-4, where it is -x/3; found by
            # an accuracy hunt)
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
    # tanh(log(x))**c at 0 is nan, which stopped generation with a TypeError; a fuzz find)
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
        # expm1(expm1(acos(x)/x)) near 0 (found by the fuzz campaign)
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


STABLE_FUNCTIONS = (
    softplus,
    sigmoid,
    mish,
    silu,
    log_sigmoid,
    ndtr,
    erfcx,
    log_ndtr,
    logaddexp,
    hypot,
    norm_ratio,
    hypot_excess,
    hypot_plus,
    xlogy,
    guard,
    log1mexp,
    log_sinh,
    log_erf,
    power_excess,
    finite,
)
