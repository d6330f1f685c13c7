"""SymPy functions with numerically stable torch kernels, for :mod:`symgrad.rewrite`.

Each is a :class:`sympy.Function` with an exact ``fdiff`` (so gradients and double
gradients stay symbolic and correct), an mpmath implementation (``_imp_``, which
``lambdify(..., "mpmath")`` and ``evalf`` use), and a torch spelling in
:data:`symgrad.codegen.printer.PRINTERS` (or, for the generated families below, a ``torch_code``
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

import math

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
        # pdf(u)/ndtr(u), 0/0 in float32 from u = -14: tails._normal_tail_products writes it
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
    (roots._rule_hypot nests them in it; hypot_plus.root builds the same root)."""
    return (bool(arg.is_number), sympy.default_sort_key(arg))


class norm_ratio(StableFunction):  # noqa: N801
    """``a/n``, a component ``a`` of a norm ``n`` (``hypot``) over that norm: at most 1 in
    magnitude, so it neither overflows nor underflows where ``a`` and ``n`` are finite.

    It exists to keep the quotient whole: SymPy merges ``(a/n)**2/n`` back into
    ``a**2*n**-3``, which overflows and underflows in float32 where the norm is beyond 7e12
    or below 1.4e-13 (``hypot``'s second derivatives; roots._rule_norm_ratio).
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
    def torch_code(cls, printer, args: list, values: tuple[sympy.Expr, ...] = ()):
        """:meth:`expanded`, printed (a syntax tree) with the arguments' code, the printer's
        ``Printed`` (``values``: the arguments
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
    there. ``-expm1(-2u)`` keeps ``2u`` near 0, where the log
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
    at x = 5, where it is -1.5e-12. ``log1p(-erfc(u))`` keeps that
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
    ``p`` (roots._rule_power_minus_value, for the exponents that have no polynomial of
    their own, and in derivative formulas those with sums of roots, whose autograd
    derivative is not exact): ``a**p*expm1(p*log1p(u/a))`` where ``|p*log1p(u/a)| <= R``,
    ``R = max(1, |p|/2)``, and as written elsewhere.

    As written the power rounds to ``a**p`` near ``u = 0``, and the difference to 0:
    Barron's robust loss ``2*((1 + x**2/2)**0.25 - 1)`` was 0 in float32 at x = 1e-4,
    and ``1/sqrt(1 + x**2) - 1`` too. The expm1 form is exact
    there, but the rounding of its argument ``w = p*log1p(u/a)``, about ``2|w|`` ulps of
    the value, grows far from 0: ``(1 + x)**7.5 - 1`` was 5.4e-6 off at x = 1e4 in float32.
    As written, the rounding of ``a + u`` costs about ``|p|/2`` ulps of the power, and
    where ``|w| >= 1`` the difference loses at most a factor e/(e - 1) more: so the switch
    is where both are about ``|p|`` ulps or less (at ``|w| = 1`` it cost 30 ulps for p =
    20.5). The switch points are dyadic, just inside that range, and
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
    (roots._rule_power_minus_value: ``1/(1 + x**2) - 1`` as ``-x**2/(1 + x**2)``, nan from
    |x| = 1.9e19 in float32).
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
    (float16's 65504 plus b overflowed). At ``a = +-inf`` the quotient is
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

    ``b`` is a nonzero number (roots._hypot_sum): at ``b = u = 0`` the quotient would be
    0/0. As written it cancels where ``u`` is negative and large next to ``b``: squareplus
    ``(x + sqrt(x**2 + 4))/2`` was 0 in float32 from ``x = -1e4`` (truth 1e-4), and
    ``sqrt(x**2 + 1) - x``, which is ``hypot_plus(-x, 1)``, from ``x = 4096``. No term
    cancels here, and every one is finite with finite derivatives wherever ``2u`` is (it
    is about the value), so no ``torch.where`` is needed (a guarded Piecewise made squareplus's forward plus
    backward 10x slower, and a where of the two forms 4x). At ``u = 0`` autograd's
    derivatives of ``|u|`` and ``sign(u)`` are 0, which leaves the right slope, 1.
    The quotient is ``b*(b/(...))``, kept whole by functions.norm_ratio, so
    ``b**2`` is never formed: it would overflow in float16 from ``b = 256``.
    """

    nargs = 2

    @staticmethod
    def root(u: sympy.Expr, b: sympy.Expr) -> hypot:
        """``hypot(u, b)``, without a minus sign and with its arguments in the order
        roots._rule_hypot gives them, the number ``b`` last (hypot is even in each, and
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
    negation, log(x) <= 1, would not hold either.
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
