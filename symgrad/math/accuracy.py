"""Accuracy probes in mpmath: whether a form is accurate in float32 rounding next to an equal
one (:func:`_as_accurate`), and whether a formula is finite wherever the mathematics is
(:func:`finite_where_the_math_is`), from exact values at probe points.
"""

from __future__ import annotations

import functools
import itertools
import struct

import mpmath
import sympy

from .probe import FLOAT64_MAX, probe_code, PROBE_FAILURES, real_only, wrap_probe_calls
from .series import _as_printed
from .simplify import op_count, SIMPLIFY_MAX_OPS


# Accuracy budget for a form that reuses shared work (reuse_shared_work): relative error,
# in float32 rounding, at most this many units in the last place of the exact value, or no
# worse than the form it replaces.

REUSE_MAX_ULPS = 16
# Where the reuse forms are checked: both signs of these magnitudes, in 24-bit (float32)
# arithmetic against 80-bit. A form like 1 - sigmoid(u) fails where u is about 10-100,
# and u may be x scaled down (50*tanh(x/50): x of 500-5000), so the probes run over many
# decades (the fused gradient of 50*tanh(x/50) was 0 from x = 450).

REUSE_PROBES = (
    0.001, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 80.0,
    150.0, 300.0, 600.0, 1e3, 2e3, 5e3, 1e4, 3e4, 1e5, 1e6, 1e7, 1e8, 1e10, 1e15, 1e20, 1e30,
)


def _as_accurate(candidate: sympy.Expr, reference: sympy.Expr) -> bool:
    """Whether ``candidate`` (equal to ``reference``) is accurate enough in float32 rounding.

    Checked for one variable at the REUSE_PROBES, in mpmath at 24 bits of precision (float32's
    mantissa) against ``reference`` at 80 bits; expressions of several symbols keep their form.
    """
    symbols = sorted(reference.free_symbols | candidate.free_symbols, key=lambda s: s.name)
    if len(symbols) != 1:
        return False
    try:
        # Real-only, as in sampling_domain: the generated code computes over the reals, and
        # mpmath's complex digamma of log(-20)-like values loops for minutes.
        evaluate_candidate, evaluate_reference = (
            real_only(probe_code(symbols, expr))
            for expr in (candidate, reference)
        )
    except (TypeError, ValueError, KeyError):
        return False
    for magnitude in REUSE_PROBES:
        for point in (mpmath.mpf(magnitude), mpmath.mpf(-magnitude)):
            try:
                with mpmath.workprec(80):
                    exact = _as_mpf(evaluate_reference(point))
            except PROBE_FAILURES:
                continue  # outside the function's domain: no constraint here
            if not (isinstance(exact, mpmath.mpf) and mpmath.isfinite(exact)):
                continue
            if exact and not _FLOAT32_TINY <= abs(exact) <= _FLOAT32_MAX:
                # Beyond float32's normal range the value is 0 or inf there whatever the form
                # (mpmath has no underflow: x*tanh(softplus(x)) at -1e15 is -1e-434294481903237).
                continue
            allowed = REUSE_MAX_ULPS * 2.0**-24 * abs(exact)
            try:
                with mpmath.workprec(24):
                    before = _as_mpf(evaluate_reference(point))
                if isinstance(before, mpmath.mpf) and mpmath.isfinite(before):
                    allowed = max(allowed, abs(before - exact))
            except PROBE_FAILURES:
                pass  # the form it replaces fails here in float32 too: allow the 16 ulps
            try:
                with mpmath.workprec(24):
                    got = _as_mpf(evaluate_candidate(point))
            except PROBE_FAILURES:
                return False  # fails (1/0, say) where the mathematics is finite
            if not (isinstance(got, mpmath.mpf) and mpmath.isfinite(got)) or abs(got - exact) > allowed:
                return False
    return True


_FLOAT32_TINY = 2.0**-126  # the smallest normal float32
_FLOAT32_MAX = (2 - 2.0**-23) * 2.0**127


# (bits of precision, largest finite value, smallest subnormal) of float32 and float64.

_FLOAT_FORMATS = ((24, _FLOAT32_MAX, 2.0**-149), (53, FLOAT64_MAX, 2.0**-1074))
# What a function the probe refuses to compute (beyond PROBE_MAX_EXPONENT) is in floating
# point: that far out, it has overflowed or underflowed.

_BEYOND_PROBE = {
    "exp": lambda a: mpmath.inf if a > 0 else mpmath.mpf(0),
    "expm1": lambda a: mpmath.inf if a > 0 else mpmath.mpf(-1),
    "sinh": lambda a: mpmath.inf if a > 0 else -mpmath.inf,
    "cosh": lambda a: mpmath.inf,
    "_probe_power": lambda base, exponent: _float_power(base, exponent),
}


def _float_power(base, exponent):
    """base**exponent as IEEE arithmetic has it, where mpmath refuses or the probe will not
    compute it: inf**-2 is 0 and 0**-1 is inf (torch), not OverflowError or ZeroDivisionError."""
    if base == 0:
        if exponent < 0:
            return mpmath.inf
        return mpmath.mpf(0) if exponent > 0 else mpmath.mpf(1)
    if mpmath.isinf(base):
        return mpmath.power(base, exponent)
    size = exponent * mpmath.log(abs(base))  # (the probe refused it: far beyond any float)
    return (mpmath.inf if size > 0 else mpmath.mpf(0)) * (-1 if base < 0 and exponent % 2 == 1 else 1)


def _in_float_range(evaluate, largest: float, smallest: float):
    """Make every function the probe code calls round its result to a float format's range,
    as torch computes: beyond ``largest`` it is inf, below ``smallest`` 0. mpmath has no
    overflow, so cosh(x)**-3 stays accurate there at any x where float32 has inf (and
    inf*0 and inf/inf, nan, follow from mpmath's own arithmetic on inf). Powers (and so
    quotients) are calls here; sums and products are not rounded, so x**5*y**5*exp(-x) at
    x = y = 1e4, nan in float32, passes."""
    return wrap_probe_calls(
        evaluate, lambda name, function: _rounded_to_range(function, largest, smallest, _BEYOND_PROBE.get(name))
    )


def _rounded_to_range(fn, largest: float, smallest: float, beyond_probe):
    largest, smallest = mpmath.mpf(largest), mpmath.mpf(smallest)  # (see probe._guard)

    def rounded(*args):
        try:
            value = fn(*args)
        except (OverflowError, ZeroDivisionError):
            if beyond_probe is None:
                raise
            return beyond_probe(*args)
        if isinstance(value, mpmath.mpf) and mpmath.isfinite(value):
            if abs(value) > largest:
                return mpmath.inf if value > 0 else -mpmath.inf
            if abs(value) < smallest:
                return mpmath.mpf(0)
        return value

    return rounded


# A second derivative off by more than this in float arithmetic is not rounding, nor the
# cancellation any form has near a zero of it (sigmoid(x*y)'s at x = y = 1e-3 is 5% off in
# float32), but a form that overflows or cancels terms far larger than itself: SiLU's, with
# sinh(x/2) and sigmoid(-x)**1.5 as SymPy simplifies it, was 1.0 at x = 100 in float32
# where the truth is -3.6e-42.

_SECOND_DERIVATIVE_MAX_ERROR = 0.5
# The probes stop where the stability tests' points do, at 1e4: beyond, the user's own
# expression fails in float32 (exp(-x)*log1p(y**2) is 0*inf = nan at x = 300, y = 1e30,
# forward included), so no form of its derivatives could be told from another there.

_SECOND_DERIVATIVE_PROBE_MAX = 1e4
# The probes for two symbols: every pair of REUSE_PROBES would be 1936 points. These keep
# float32's overflows (from 89 for exp and cosh, 179 for cosh(x/2)) and float64's (710, 1420).

_PAIR_PROBES = (1e-20, 0.001, 0.5, 3.0, 20.0, 100.0, 300.0, 3e3, 1e4)
# ... and for one symbol, beyond the REUSE_PROBES up to _SECOND_DERIVATIVE_PROBE_MAX: far from
# any sampling domain, down to where float32 is subnormal and up to where it overflows
# (sigmoid's autograd second derivative s*(1 - s)*(1 - 2*s) cancels to 0 below |x| = 1e-8
# in float32, where it is -x/4; the tests' range sweep found it at 1e-12).

_FAR_PROBES = (1e-30, 1e-12, 1e-6, 1e6, 1e10, 1e20, 1e30)
# ... and for three, every triple of these (512 points, against 256 for a pair): products
# of three reach into float32's overflows from 3*3*3 (log(1+exp(x*y*z))'s autograd second
# derivative is 0 there, the exact one 1e-11) and float64's from 30*30*3.

_TRIPLE_PROBES = (0.5, 3.0, 30.0, 1e4)
# A reference value that is finite but cancels beyond the precisions tried (about 2000 bits:
# at x = 700 the terms of SiLU's simplified second derivative are e**350 times larger, which
# 512 bits resolve; 2048 bits cover terms up to float64's range).

_UNRESOLVED = object()


def _as_mpf(value):
    """A probe's value as an mpf where it is a Python number: a Piecewise branch that is a
    constant evaluates to the int 1, and such points were skipped as not real (the untaken
    branch of Piecewise((sqrt(y - 100), x > 0), (y, True))'s derivative by y was never
    probed where x <= 0)."""
    return mpmath.mpf(value) if isinstance(value, (int, float)) else value


def _exact_value(evaluate, point):
    """The value at ``point``, at a precision that two evaluations agree on (to about 40
    bits); _UNRESOLVED where they never agree but are finite; None where it is not a
    finite real."""
    previous = None
    for bits in (64, 128, 512, 2048):
        try:
            with mpmath.workprec(bits):
                value = _as_mpf(evaluate(*point))
        except PROBE_FAILURES:
            return None
        if not (isinstance(value, mpmath.mpf) and mpmath.isfinite(value)):
            return None
        # (Not two zeros short of the last precision: 1 - tanh(x)**2 rounds to 0 at 128 bits
        # where x = 50, and tanh(softplus(x))'s second derivative went unprobed there.)
        if previous is not None and abs(value - previous) <= 2.0**-40 * abs(value) and (value != 0 or bits == 2048):
            return value
        previous = value
    return _UNRESOLVED


def finite_where_the_math_is(candidate: sympy.Expr, reference: sympy.Expr, *, far: bool = True) -> bool:
    """Whether ``candidate`` (equal to ``reference``) computes a value that is not nan, and
    not far off the exact one where finite, in float32 and float64 arithmetic wherever that
    exact value is finite and in the format's range: no inf/inf, inf*0 or cancellation of
    overflowing terms.

    Checked at both signs of the REUSE_PROBES up to _SECOND_DERIVATIVE_PROBE_MAX (of
    _PAIR_PROBES, every pair, for two symbols; of _TRIPLE_PROBES, every triple, for three
    within SIMPLIFY_MAX_OPS operations),
    each rounded to float32 (so the same point in both formats: x - y is 0 at x = y in
    either), against ``reference`` evaluated exactly (_exact_value), where the reference's
    own terms stay within float64's range (_exact_values); where it cancels beyond the
    precisions tried, the value need only not be nan. Other expressions are not checked
    (True). ``far=False`` leaves out the _FAR_PROBES: for a replacement form, which need only
    hold where it did before they were added (see second_order.exact_second_derivatives).
    """
    symbols = tuple(sorted(reference.free_symbols | candidate.free_symbols, key=lambda s: s.name))
    if not 1 <= len(symbols) <= 3:
        return True
    if len(symbols) == 3 and op_count(reference) > SIMPLIFY_MAX_OPS:
        # (512 points of a large expression cost seconds: the 40-term, 3-input expression's
        # --save speed second derivatives took 10 s more to probe. Unchecked, as before.)
        return True
    # As printed: a Removable is a torch.where of its series and its closed form, which mpmath
    # would otherwise evaluate exactly (at 30 more digits) and so never see overflow.
    candidate = _as_printed(candidate)
    try:
        exact_values = _exact_values(reference, symbols, far)
        in_formats = [_in_float_range(probe_code(symbols, candidate), largest, smallest) for _, largest, smallest in _FLOAT_FORMATS]
    except (TypeError, ValueError, KeyError):
        return True  # not printable for mpmath: left to the stability tests, as before
    for point, exact in exact_values:
        for (bits, largest, smallest), evaluate in zip(_FLOAT_FORMATS, in_formats):
            if exact is not _UNRESOLVED and abs(exact) > largest:
                continue
            try:
                with mpmath.workprec(bits):
                    got = _as_mpf(evaluate(*point))
            except PROBE_FAILURES:
                return False
            if not isinstance(got, mpmath.mpf) or mpmath.isnan(got):
                return False
            if mpmath.isinf(got) or exact is _UNRESOLVED:
                # inf where the exact value is finite is an intermediate overflowing first, which
                # some products cannot avoid: exp(-x)*log1p(y**2) at x = -100, y = 1e-3 in float32.
                continue
            # Near the subnormal range an absolute error of the smallest normal number is
            # rounding (2**-126 in float32: the smallest subnormal times 2**23).
            if abs(got - exact) > max(_SECOND_DERIVATIVE_MAX_ERROR * abs(exact), smallest * 2.0 ** (bits - 1)):
                return False
    return True


@functools.lru_cache(maxsize=64)
def _exact_values(reference: sympy.Expr, symbols: tuple[sympy.Symbol, ...], far: bool = True) -> tuple:
    """(point, exact value) at each probe point where the value is finite and not 0: for
    finite_where_the_math_is, which checks up to two forms of each derivative against one
    reference. (At an exact zero of a factor, any form is 0*inf = nan once another factor
    overflows: (1 - y**2)*exp(-x) at y = 1, x = -100 in float32.)

    Real-only, and without intermediates beyond float64 (real_only): where the reference
    has one (exp(1e3) in sigmoid's second derivative at x = -1e3), the point is skipped, so
    float64's own overflows go unprobed. Allowed further, x**y at x = y = 1e4, 1e40000, went
    into sigmoid's mpmath exp, which took minutes.
    """
    evaluate = real_only(probe_code(symbols, reference))
    single = sorted([m for m in REUSE_PROBES if m <= _SECOND_DERIVATIVE_PROBE_MAX] + list(_FAR_PROBES if far else ()))
    pairs = _PAIR_PROBES if far else _PAIR_PROBES[1:]
    magnitudes = (single, pairs, _TRIPLE_PROBES)[len(symbols) - 1]
    # Rounded to float32, and so exact in float64 too.
    rounded = [mpmath.mpf(struct.unpack("f", struct.pack("f", m))[0]) for m in magnitudes]
    signed = [m * sign for m in rounded for sign in (1, -1)]
    values = []
    for point in itertools.product(signed, repeat=len(symbols)):
        exact = _exact_value(evaluate, point)
        if exact is not None and exact != 0:  # (None: outside the domain, or beyond the probe)
            values.append((point, exact))
    return tuple(values)
