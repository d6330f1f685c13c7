"""Piecewise guards (the "double where"): each symbol in a branch that is not a polynomial is
guarded, so that an untaken branch is evaluated at a safe point and cannot leak inf/NaN into
gradients; and Heaviside masks that would multiply an overflow.
"""

from __future__ import annotations

import itertools

import sympy
from sympy.codegen.cfunctions import expm1

from ..math.functions import guard, sigmoid, softplus
from ..math.probe import moderate, probe_code, PROBE_FAILURES, real_only
from ..math.rounding import round_half_even
from .patterns import _expand, _number


_OVERFLOWING = (sympy.exp, expm1, sympy.cosh, sympy.sinh, sympy.tan, sympy.gamma)


def _can_overflow(expr: sympy.Expr) -> bool:
    """Whether ``expr`` may be inf where it is not taken: an exp-like function. (Not any
    negative power: 1/(1 + Max(x, 0)) in the gradient of log(1 + Max(x, 0)) cannot be inf,
    and the Piecewise's guards made its backward 6x slower. A quotient
    that is inf only where its denominator is exactly 0 makes nan at that point alone.)"""
    return expr.has(*_OVERFLOWING)


def _rule_heaviside_mask(node: sympy.Expr):
    """``Heaviside(u)*f`` -> ``Piecewise((Heaviside(u)*f, u >= 0), (0, True))`` where ``f``
    may overflow: printed as ``0.5*(sign(u) + 1)*f`` it is 0*inf = nan where u < 0 and f
    overflows. The derivative of Min(0, u) holds Heaviside(-u)*u': ELU written with Max and
    Min, ``Max(x, 0) + Min(0, exp(x) - 1)``, had a nan gradient from x = 89 in float32, as
    autograd's has; as a Piecewise the untaken branch is cut
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
            # double backward multiplied its nan by where's zero gradient.
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
        return bool(value.is_finite)  # (sqrt(2) too, not only atoms)
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
    at x = 4 and leaked nan into double backward.)

    First choice: the points that ``taken``'s linear bounds give, which keep the branch
    inside its own region (``x > y`` guards ``x`` by ``y + 1``). Where those leave the
    untaken branch's partial derivatives non-finite somewhere (a symbol the condition does
    not bound, as ``z`` in ``hypot(y, log(z))`` under ``x > 0``; an ``Or``, negated or
    nonlinear condition), every symbol of the branch is guarded by a number instead: a
    point found by probing where the branch and its partial derivatives are finite;
    where no point tried passes, the first of _SAFE_NUMBERS all the same. Where SymPy
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
    # derivative was nan from x = 88.7*a in float32).
    probed = _steps_as_constants(value)
    try:
        partials = [probed.diff(s) for s in symbols]
    except (TypeError, ValueError, ArithmeticError, NotImplementedError):
        return linear
    if any(d.has(sympy.Derivative) for d in partials):
        # SymPy left one unevaluated (ceiling's): the probe cannot evaluate it, and putting
        # a number in for the symbol raised ("can't calculate derivative wrt 4").
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
        # Left unguarded, the nan reached the gradient.
        point = (_SAFE_NUMBERS[0],) * len(symbols)
    # ((-x)**(x**2*acosh(x)), under a condition that always holds after a branch taken for
    # x > 1.1, was nan there.)
    return _replace_in_values(value, {s: guard(s, condition, p, earlier) for s, p in zip(symbols, point)})


# Piecewise-constant functions: autograd's derivative of each (torch.sign's, floor's) is 0.

_STEPS = (sympy.sign, sympy.Heaviside, sympy.floor, sympy.ceiling, round_half_even)


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
    imaginary parts it expanded for minutes.
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
        # tests the symbol itself.)
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
# bound is the simplification bound (simplify.SIMPLIFY_MAX_OPS).

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
