"""``round_half_even(u)``: rounding to the nearest integer, ties to the even one, as
``torch.round`` rounds (and Python's ``round``, and ``mpmath.nint``).

SymPy has no such function: ``sympy.floor``'s machinery pulls integers out of its argument
(``floor(x + 3) = floor(x) + 3``), which is wrong for ties-to-even (``round(0.5 + 3)`` is 4,
``round(0.5) + 3`` is 3), so this is a plain :class:`sympy.Function` that only evaluates at
numbers. Like floor, it is piecewise constant: its derivative is 0 almost everywhere, which
is the gradient autograd gives ``torch.round``; users who want a straight-through gradient
say so with ``--grad x=1``.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import sympy
from sympy.core.function import ArgumentIndexError


class round_half_even(sympy.Function):  # noqa: N801 (SymPy's naming)
    """The nearest integer to ``u``; halves round to the even neighbour."""

    nargs = 1

    @classmethod
    def eval(cls, u):
        if u.is_Integer:
            return u
        if u.is_Rational or u.is_Float:
            # Python's round of an exact Fraction is ties-to-even, with no float rounding.
            numer, denom = sympy.Rational(u).as_numer_denom()
            return sympy.Integer(round(Fraction(int(numer), int(denom))))
        return None

    def _eval_evalf(self, prec):
        value = self.args[0].evalf(prec)
        if value.is_Number:
            return round_half_even(value)
        return None

    @staticmethod
    def _imp_(u):
        return mpmath.nint(mpmath.mpmathify(u))

    def fdiff(self, argindex=1):
        if argindex != 1:
            raise ArgumentIndexError(self, argindex)
        return sympy.Integer(0)

    def _eval_is_integer(self):
        return True if self.args[0].is_extended_real else None

    def _eval_is_real(self):
        return self.args[0].is_extended_real

