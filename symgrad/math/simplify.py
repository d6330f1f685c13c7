"""Bounded simplification: :func:`cheapest_form` tries ``simplify`` only where it finishes
in bounded time (SIMPLIFY_MAX_* below) and keeps the form with the fewest operations
(:func:`op_count`).
"""

from __future__ import annotations

import sympy


# simplify() is only tried on expressions (or Add terms) at most this big: on larger
# ones it can run for minutes (facts.md), and it rarely pays anyway.

SIMPLIFY_MAX_OPS = 40
# ... and not where the exponents of powers of sums add up to more than this: simplify
# expands them, so a tiny 1000*(x + y + z)**999 would never finish, and it puts the terms
# over one denominator, so 2*sinh(x)/(2*x + sinh(x))**3 + 6/(y**2 - x)**4 + ... (a second
# derivative, exponents 3 + 4 + 4) ran for minutes.

SIMPLIFY_MAX_POWER = 8
# ... nor where folding its Piecewise/Max/Min together makes more than this many branches:
# simplify folds them and then simplifies every branch (Piecewise(2) - Max(4 args) with a
# nested Piecewise ran for minutes).

SIMPLIFY_MAX_BRANCHES = 8
# ... nor on Piecewise conditions of more comparisons than this, all together.

SIMPLIFY_MAX_COMPARISONS = 8
# ... nor where any power has an exponent above this: trigsimp factored the speed-mode
# second derivative of tanh(x**100), with x**198 and cosh(x**100)**-4, for minutes.

SIMPLIFY_MAX_DEGREE = 32
# ... nor where a rational has a denominator above this, as a float constant becomes
# (1e-3 from expm1(log1p(1e-3)) is 1152921504606847/1152921504606846976): logcombine ran
# for minutes on a Heaviside of log(x - 1e-3) minus that.

SIMPLIFY_MAX_DENOMINATOR = 10**12


# What a real, finite derivative cannot hold.

_UNDEFINED = (sympy.I, sympy.zoo, sympy.nan, sympy.AccumBounds)


def _shown(expr: sympy.Expr) -> str:
    """``str(expr)`` for a message; SymPy cannot order a sum holding nan to print it,
    and then the message says so instead of crashing."""
    try:
        return str(expr)
    except (TypeError, ValueError):
        return "(an expression with an undefined value)"


def op_count(expr: sympy.Expr) -> int:
    """The cost model for choosing between equal forms: SymPy's operation count."""
    return int(sympy.count_ops(expr))


def cheapest_form(expr: sympy.Expr) -> sympy.Expr:
    """The cheapest of a few equal forms, by :func:`op_count`, in bounded time.

    ``simplify`` is only tried on small expressions, or term by term on the small terms of
    a large sum, so its cost grows linearly with the expression.
    """
    candidates = [expr, sympy.factor_terms(expr)]
    if _simplify_is_bounded(expr):
        candidates.append(_simplified(expr))
    elif isinstance(expr, sympy.Add):
        candidates.append(sympy.Add(*(_simplified(t) if _simplify_is_bounded(t) else t for t in expr.args)))
    if not expr.has(*_UNDEFINED):
        # A form with I where the derivative had none: simplify turned x**2/(sqrt(x**2 - 1)*
        # Abs(x)) + acosh(Abs(x)) into a Piecewise with I*pi/2 at x = 0, and factor_terms
        # takes sqrt(-1) out of sqrt(-x**4 + ...), where the function is complex anyway; the
        # generated code could not even print it.
        candidates = [c for c in candidates if not c.has(*_UNDEFINED)]
    # Ties go to the earliest candidate, so the choice is deterministic.
    return min(candidates, key=op_count)


def _simplified(expr: sympy.Expr) -> sympy.Expr:
    """``simplify``, or ``expr`` itself where SymPy fails on it: simplification is optional.

    (SymPy raises, e.g. "The argument 'exp(-1)*_rf(1, E)' is not comparable." from Max
    inside simplify, a RecursionError on nested Piecewise, or a KeyError from logcombine on
    a log of zoo/x**2.)
    """
    abstracted, arguments = _abstract_trig_arguments(expr)
    try:
        simplified = sympy.simplify(abstracted, ratio=1)
        # Newest first: a symbol's value may hold older symbols (sinh(sinh(u)) nests them).
        for dummy, value in reversed(arguments.items()):
            simplified = simplified.xreplace({dummy: value})
        return simplified
    except (
        ValueError,
        TypeError,
        ArithmeticError,
        AttributeError,
        LookupError,
        RecursionError,
        sympy.polys.polyerrors.PolynomialError,
    ):
        return expr


_TRIG = (
    sympy.sin, sympy.cos, sympy.tan, sympy.cot, sympy.sec, sympy.csc,
    sympy.sinh, sympy.cosh, sympy.tanh, sympy.coth, sympy.sech, sympy.csch,
)


def _abstract_trig_arguments(expr: sympy.Expr) -> tuple[sympy.Expr, dict[sympy.Dummy, sympy.Expr]]:
    """Replace each compound argument of a (hyperbolic) trig function by a symbol.

    trigsimp inside simplify expands multiple-angle and sum formulas: it took 64 s on the
    10-op -128*sinh(8*x + 16)/cosh(8*x + 16)**3. Over a symbol
    it keeps the identities that matter here (sin**2 + cos**2 = 1, sinh/cosh = tanh) and
    finishes at once. Returns the new expression and the map back, oldest symbol first.
    """
    symbols: dict[sympy.Expr, sympy.Dummy] = {}

    def symbol_for(value: sympy.Expr) -> sympy.Dummy:
        if value not in symbols:
            symbols[value] = sympy.Dummy(f"arg{len(symbols)}", real=True)
        return symbols[value]

    if _mixes_trig(expr):
        # Next to radicals of sums or other transcendental functions, trigsimp factors over
        # algebraic extensions for minutes ((acosh(x) - x + 1)**(cosh(x) - atan(x)))
        # : the trig calls themselves become symbols.
        def abstract(e: sympy.Expr) -> sympy.Expr:
            return e.replace(lambda n: isinstance(n, _TRIG), symbol_for)
    else:
        def abstract(e: sympy.Expr) -> sympy.Expr:
            return e.replace(
                lambda n: isinstance(n, _TRIG) and not n.args[0].is_Atom, lambda n: n.func(symbol_for(n.args[0]))
            )
    # Until nothing changes: replacing cosh(x) inside sinh(y - cosh(x)) rebuilds it as
    # -sinh(_arg - y), a new node the same pass does not visit, and trigsimp then ran for
    # 100 s on one speed-mode second derivative.
    abstracted = abstract(expr)
    for _ in range(_ABSTRACT_MAX_PASSES):
        again = abstract(abstracted)
        if again == abstracted:
            break
        abstracted = again
    return abstracted, {dummy: value for value, dummy in symbols.items()}


_ABSTRACT_MAX_PASSES = 8


def _mixes_trig(expr: sympy.Expr) -> bool:
    """Whether ``expr`` has trig functions next to other functions or radicals."""
    if not expr.has(*_TRIG):
        return False
    others = any(
        isinstance(node, sympy.Function) and not isinstance(node, _TRIG) for node in sympy.preorder_traversal(expr)
    )
    # (sqrt(z) next to sinh(z) too: a speed-mode second derivative of sinh(z)*sqrt(z) ran
    # for minutes)
    radicals = any(not p.exp.is_Integer for p in expr.atoms(sympy.Pow))
    # (and trig inside trig: the speed-mode second derivative of sinh((x + 1)*sinh(x)) ran
    # for minutes in polynomial division)
    nested = any(isinstance(node, _TRIG) and node.args[0].has(*_TRIG) for node in sympy.preorder_traversal(expr))
    # (and trig in a sum raised to a power: trigsimp ran for minutes on the second derivative
    # of (tanh(x) - x**-2)**-2, with (tanh(x) - 1/x**2)**-3 and **-4 in it)
    powered = any(p.base.is_Add and p.base.has(*_TRIG) and abs(p.exp) > 1 for p in expr.atoms(sympy.Pow) if p.exp.is_Number)
    return others or radicals or nested or powered


def _piecewise_branches(expr: sympy.Expr) -> int:
    """How many branches folding every Piecewise, Max and Min of ``expr`` together can make."""
    branches = 1
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, (sympy.Piecewise, sympy.Max, sympy.Min)):
            branches *= len(node.args)
    return branches


def _condition_comparisons(expr: sympy.Expr, disjunctive: bool = False) -> int:
    """How many comparisons the conditions of ``expr``'s Piecewise hold, repeats included;
    ``disjunctive``: once each condition is in disjunctive normal form, as piecewise_simplify
    puts it to find its intervals."""
    conditions = [condition for piecewise in expr.atoms(sympy.Piecewise) for _, condition in piecewise.args]
    if disjunctive:
        conditions = [sympy.to_dnf(condition) for condition in conditions]
    return sum(
        sum(1 for node in sympy.preorder_traversal(condition) if isinstance(node, sympy.core.relational.Relational))
        for condition in conditions
    )


def _nested_call(condition: sympy.Basic) -> bool:
    """Whether ``condition`` calls a function of a function (log(log(x)))."""
    return any(
        isinstance(node, sympy.Function) and any(isinstance(inner, sympy.Function) for arg in node.args for inner in sympy.preorder_traversal(arg))
        for node in sympy.preorder_traversal(condition)
    )


def _simplify_is_bounded(expr: sympy.Expr) -> bool:
    """Whether ``simplify`` runs in bounded time on ``expr`` (small, no large powers of sums)."""
    if op_count(expr) > SIMPLIFY_MAX_OPS:
        return False
    if expr.has(sympy.gamma, sympy.loggamma, sympy.polygamma):
        # gammasimp inside simplify ran for minutes on a 30-op derivative with
        # polygamma(1, cosh(2*x))
        return False
    if _piecewise_branches(expr) > SIMPLIFY_MAX_BRANCHES:
        return False
    conditions = [c for node in sympy.preorder_traversal(expr) if isinstance(node, sympy.Piecewise) for _, c in node.args]
    if any(c.has(sympy.ITE, sympy.Piecewise, sympy.Max, sympy.Min) for c in conditions):
        # A branch condition that compares with a bool (2*x < (x <= 2.5) is an ITE) or a
        # Piecewise: piecewise_simplify's interval search ran for minutes.
        return False
    if any(_nested_call(c) for c in conditions):
        # piecewise_simplify solves each condition for its symbol: log(log(x, 10), 10) > 10
        # inverts to x > 10**(10**10), and evaluating that ran for minutes.
        return False
    if _condition_comparisons(expr) > SIMPLIFY_MAX_COMPARISONS:
        # simplify's logic minimisation on a condition of 17 comparisons (a Piecewise inside
        # another's condition, expanded) ran for over 10 minutes
        return False
    if _condition_comparisons(expr, disjunctive=True) > SIMPLIFY_MAX_COMPARISONS:
        # ... and on 8 that a negated conjunction spreads out: (a & ~(b & c & d)) | (b & c & d &
        # e) is 4 conjunctions of 10 comparisons, and took 42 s on its own.
        # Bounded: 8 comparisons spread into at most 18 conjunctions (3*3*2).
        return False
    if any(abs(r.q) > SIMPLIFY_MAX_DENOMINATOR for r in expr.atoms(sympy.Rational)):
        return False
    powers = [p for p in expr.atoms(sympy.Pow) if p.exp.is_Rational]
    if any(abs(p.exp) > SIMPLIFY_MAX_DEGREE for p in powers):
        return False
    powers_of_sums = (abs(p.exp) for p in powers if p.base.is_Add)
    return sum(powers_of_sums) <= SIMPLIFY_MAX_POWER
