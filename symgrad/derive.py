"""Stage 2: gradients, bounded simplification, stability rewrites and sampling domains."""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from .errors import SymgradError
from .parse import Parsed
from .stable import stabilize

# simplify() is only tried on expressions (or Add terms) at most this big: on larger
# ones it can run for minutes (facts.md), and it rarely pays anyway.
SIMPLIFY_MAX_OPS = 40

# Candidate sampling intervals, tried in order; the first on which the function and its
# gradients are finite and moderate wins. Chosen to suit common domains: all reals,
# positive, the open unit interval, above one.
DOMAIN_CANDIDATES = ((-3.0, 3.0), (0.1, 3.0), (-0.9, 0.9), (1.1, 3.0), (0.1, 0.9), (-3.0, -0.1))
DOMAIN_PROBES = 64
DOMAIN_MAX_ABS = 1e3


@dataclass(frozen=True)
class Derivation:
    """Stage-2 result.

    Args:
        parsed: the stage-1 result.
        forward: each output's elementwise expression, stabilised.
        gradients: ``gradients[i][j]`` is d(output i)/d(input j) (or its surrogate).
        surrogate: per input, whether its gradient is a declared surrogate.
        nondifferentiable: per output, whether it is piecewise constant in every input.
        domain: a sampling interval for every input and param, in signature order.
        derived_domain: per symbol, whether the interval was derived (not given).
    """

    parsed: Parsed
    forward: tuple[sympy.Expr, ...]
    gradients: tuple[tuple[sympy.Expr, ...], ...]
    surrogate: tuple[bool, ...]
    nondifferentiable: tuple[bool, ...]
    domain: tuple[tuple[sympy.Symbol, float, float], ...]


def derive(parsed: Parsed) -> Derivation:
    """Differentiate every output by every input, simplify within bounds, stabilise."""
    surrogates = dict(parsed.surrogates)
    forward = tuple(stabilize(out.expr) for out in parsed.outputs)
    gradients = []
    for out in parsed.outputs:
        row = []
        for symbol in parsed.inputs:
            if symbol in surrogates:
                row.append(stabilize(surrogates[symbol]))
            else:
                row.append(stabilize(cheapest_form(_differentiate(out.expr, symbol))))
        gradients.append(tuple(row))
    nondifferentiable = tuple(
        all(g == 0 for g in row) and not surrogates for row in gradients
    )
    if all(nondifferentiable):
        raise SymgradError(
            "every output is piecewise constant (its derivative is 0 almost everywhere), so there is no"
            " gradient to generate; use --grad x=EXPR for a surrogate such as a straight-through estimator"
        )
    derivation = Derivation(
        parsed=parsed,
        forward=forward,
        gradients=tuple(gradients),
        surrogate=tuple(s in surrogates for s in parsed.inputs),
        nondifferentiable=nondifferentiable,
        domain=(),
    )
    return Derivation(**{**derivation.__dict__, "domain": sampling_domain(derivation)})


def _differentiate(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    derivative = sympy.diff(expr, symbol)
    # Dirac deltas (from sign, Heaviside, Max, ...) and the derivatives of floor/ceiling are
    # zero almost everywhere, which is the gradient autograd uses for these functions.
    derivative = derivative.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.Integer(0))
    derivative = derivative.replace(
        lambda e: isinstance(e, sympy.Derivative) and isinstance(e.expr, (sympy.floor, sympy.ceiling)),
        lambda e: sympy.Integer(0),
    )
    if derivative.has(sympy.Derivative, sympy.Subs):
        raise SymgradError(f"SymPy cannot differentiate {expr} by {symbol}")
    return derivative


def op_count(expr: sympy.Expr) -> int:
    """The cost model for choosing between equal forms: SymPy's operation count."""
    return int(sympy.count_ops(expr))


def cheapest_form(expr: sympy.Expr) -> sympy.Expr:
    """The cheapest of a few equal forms, by :func:`op_count`, in bounded time.

    ``simplify`` is only tried on small expressions, or term by term on the small terms of
    a large sum, so its cost grows linearly with the expression.
    """
    candidates = [expr, sympy.factor_terms(expr)]
    if op_count(expr) <= SIMPLIFY_MAX_OPS:
        candidates.append(sympy.simplify(expr, ratio=1))
    elif isinstance(expr, sympy.Add):
        terms = [
            sympy.simplify(term, ratio=1) if op_count(term) <= SIMPLIFY_MAX_OPS else term
            for term in expr.args
        ]
        candidates.append(sympy.Add(*terms))
    # Ties go to the earliest candidate, so the choice is deterministic.
    return min(candidates, key=op_count)


def sampling_domain(derivation: Derivation) -> tuple[tuple[sympy.Symbol, float, float], ...]:
    """A sampling interval per input and param: given by ``--domain``, else derived.

    Derived intervals are the first candidates on which every output and gradient is real,
    finite and moderate at deterministic probe points, like OpInfo's input domains.
    """
    parsed = derivation.parsed
    symbols = parsed.inputs + parsed.params
    given = {name: (lo, hi) for name, lo, hi in parsed.spec.domain}
    unknown = sorted(set(given) - {s.name for s in symbols})
    if unknown:
        raise SymgradError(f"--domain names {unknown[0]!r}, which is not an input or param")
    exprs = [e for e in derivation.forward] + [g for row in derivation.gradients for g in row if g != 0]
    evaluate = sympy.lambdify(symbols, exprs, modules="mpmath")
    chosen = {s: given.get(s.name, DOMAIN_CANDIDATES[0]) for s in symbols}
    for _ in range(2):  # a second pass lets each symbol adapt to the others' choices
        for index, symbol in enumerate(symbols):
            if symbol.name in given:
                continue
            for candidate in DOMAIN_CANDIDATES:
                trial = {**chosen, symbol: candidate}
                if _all_moderate(evaluate, [trial[s] for s in symbols]):
                    chosen[symbol] = candidate
                    break
            else:
                raise SymgradError(
                    f"could not find an interval where the function and its gradients are finite for"
                    f" {symbol.name!r}; give one with --domain {symbol.name}=LOW:HIGH"
                )
    if not _all_moderate(evaluate, [chosen[s] for s in symbols]):
        raise SymgradError(
            "could not find sampling intervals where the function and its gradients are finite;"
            " give them with --domain NAME=LOW:HIGH"
        )
    return tuple((s, *chosen[s]) for s in symbols)


def _all_moderate(evaluate, intervals: list[tuple[float, float]]) -> bool:
    # A Kronecker sequence: deterministic, well spread, and free of the round numbers
    # (0, 1) where many singularities sit and through which no real sample would pass.
    steps = [math.sqrt(p) % 1 for p in (2, 3, 5, 7, 11, 13, 17, 19)]
    for k in range(1, DOMAIN_PROBES + 1):
        point = [
            lo + (hi - lo) * ((k * steps[i % len(steps)] + 0.5 * i) % 1) for i, (lo, hi) in enumerate(intervals)
        ]
        try:
            values = evaluate(*point)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            return False
        for value in values:
            try:
                real = complex(value)
            except (TypeError, ValueError):
                return False
            if real.imag != 0 or not math.isfinite(real.real) or abs(real.real) > DOMAIN_MAX_ABS:
                return False
    return True
