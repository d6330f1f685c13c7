"""Sampling domains: an interval per input and param for tests and docstrings
(:func:`sampling_domain`). A derived interval is one on which the function and its gradients
are finite and moderate; a given one (``--domain``) need only keep them finite.
"""

from __future__ import annotations

import itertools
import math
import warnings

import sympy

from ..errors import SymgradError, SymgradWarning
from ..math.probe import moderate, probe_code, PROBE_FAILURES, real_only
from .derivation import Derivation


# Candidate sampling intervals, tried in order; the first on which the function and its
# gradients are finite and moderate wins. Chosen to suit common domains: all reals,
# positive, the open unit interval, above one.

DOMAIN_CANDIDATES = ((-3.0, 3.0), (0.1, 3.0), (-0.9, 0.9), (1.1, 3.0), (0.1, 0.9), (-3.0, -0.1))
# Probe points per input or param: a region where the function is NaN is found by chance,
# and a fixed count thins out with each dimension (64 points in all missed a NaN region of
# 2% of a 3-input box a third of the time).

DOMAIN_PROBES = 64
DOMAIN_MAX_ABS = 1e3


def sampling_domain(derivation: Derivation) -> tuple[tuple[sympy.Symbol, float, float], ...]:
    """A sampling interval per input and param: given by ``--domain``, else derived.

    Derived intervals are the first candidates on which every output and gradient is real,
    finite and moderate (at most DOMAIN_MAX_ABS) at deterministic probe points, like
    OpInfo's input domains. A given interval is the user's choice, taken as it is: where the
    values on it are too large for that rule (``exp(x)`` on ``x=-20:20``), they need only be
    real and finite, the intervals derived beside it then need only keep them finite too
    (no interval could keep them moderate), and a :class:`~symgrad.errors.SymgradWarning`
    says how large they get.

    Raises:
        SymgradError: for a ``--domain`` of no input or param, a function that cannot be
            evaluated, or no intervals on which it and its gradients are real and finite.
    """
    parsed = derivation.parsed
    symbols = parsed.inputs + parsed.params
    given = {name: (lo, hi) for name, lo, hi in parsed.spec.domain}
    unknown = sorted(set(given) - {s.name for s in symbols})
    if unknown:
        raise SymgradError(f"--domain names {unknown[0]!r}, which is not an input or param")
    evaluate = _probe_function(derivation, symbols)
    chosen, failed = _search(evaluate, symbols, given, DOMAIN_MAX_ABS)
    if chosen is not None:
        return tuple((s, *chosen[s]) for s in symbols)
    if not given:
        raise _no_intervals(failed)
    # Too large or undefined with the given intervals: too large is the user's to choose.
    chosen, failed = _search(evaluate, symbols, given, math.inf)
    if chosen is None:
        if len(given) == len(symbols):
            raise _undefined_on_given(evaluate, symbols, given)
        raise _no_intervals(failed, given)
    intervals = [chosen[s] for s in symbols]
    warnings.warn(
        f"{parsed.spec.name}: the function or its gradients reach {_largest(evaluate, intervals):.3g} in size on"
        f" the sampling domain {_domain_text(symbols, intervals)} (a derived domain stays within"
        f" {DOMAIN_MAX_ABS:g}); tests with absolute tolerances, and float16 (finite to 65504), may not hold there",
        SymgradWarning,
        stacklevel=2,
    )
    return tuple((s, *chosen[s]) for s in symbols)


def _probe_function(derivation: Derivation, symbols):
    """The probe code of every output and nonzero gradient, refusing complex values."""
    exprs = [e for e in derivation.forward] + [g for row in derivation.gradients for g in row if g != 0]
    try:
        return real_only(probe_code(symbols, exprs))
    except (TypeError, ValueError, KeyError, NotImplementedError) as exc:
        # SymPy folds Piecewise while printing and can meet an undefined branch, e.g.
        # Max(log(z >= 2.5), x) has log(0) = zoo where z < 2.5;
        # a value no printer knows (PrintMethodNotImplementedError) is a NotImplementedError.
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise SymgradError(
            f"the function cannot be evaluated numerically ({type(exc).__name__}: {reason}); is it undefined"
            " somewhere, like log of a 0/1 comparison?"
        ) from None


def _search(evaluate, symbols, given: dict, largest: float):
    """Intervals for ``symbols`` (``given`` ones fixed) on which every probe value is real,
    finite and at most ``largest`` in size, as ``{symbol: (low, high)}``, and None; or None
    and the symbol that has no such interval (None when only the whole box fails)."""
    chosen, failed = _coordinate_search(evaluate, symbols, given, DOMAIN_CANDIDATES[0], largest)
    if failed is not None and len(symbols) > 1:
        # Each symbol was tried with the others on their first candidate, where another may be
        # undefined for every choice of the first: gamma(x) + loggamma(y) has gamma's poles on
        # (-3, 3) whatever y's interval, and loggamma's whatever x's. Start again
        # from the first candidate on which all of them are fine at once.
        for candidate in DOMAIN_CANDIDATES[1:]:
            if _all_moderate(evaluate, [given.get(s.name, candidate) for s in symbols], largest):
                chosen, failed = _coordinate_search(evaluate, symbols, given, candidate, largest)
                break
    if failed is not None:
        return None, failed
    if not _all_moderate(evaluate, [chosen[s] for s in symbols], largest):
        return None, None
    return chosen, None


def _no_intervals(failed, given: dict | None = None) -> SymgradError:
    """The refusal where no candidate interval will do (for ``failed``, or for the box)."""
    if given:
        # (Only finiteness was asked for: the given intervals make values large.)
        condition = f"finite with the given --domain {', '.join(f'{n}={lo:g}:{hi:g}' for n, (lo, hi) in sorted(given.items()))}"
    else:
        condition = f"finite and at most {DOMAIN_MAX_ABS:g} in size"
    if failed is not None:
        return SymgradError(
            f"could not find an interval where the function and its gradients are {condition} for"
            f" {failed.name!r}; give one with --domain {failed.name}=LOW:HIGH"
        )
    return SymgradError(
        f"could not find sampling intervals where the function and its gradients are {condition};"
        " give them with --domain NAME=LOW:HIGH"
    )


def _undefined_on_given(evaluate, symbols, given: dict) -> SymgradError:
    """The refusal of given intervals on which the function or a gradient is not real and finite."""
    intervals = [given[s.name] for s in symbols]
    point = _first_failure(evaluate, intervals, math.inf)
    where = ", ".join(f"{s.name}={value:.6g}" for s, value in zip(symbols, point))
    return SymgradError(
        f"the function or its gradients are not real and finite at {where}, inside the given --domain"
        f" {_domain_text(symbols, intervals)}; give intervals on which they are"
    )


def _domain_text(symbols, intervals) -> str:
    """``x=-20:20 y=0.1:3``, as ``--domain`` options spell the intervals."""
    return " ".join(f"{s.name}={lo:g}:{hi:g}" for s, (lo, hi) in zip(symbols, intervals))


def _largest(evaluate, intervals: list[tuple[float, float]]) -> float:
    """The largest size of a value at the probe points (where every value is finite)."""
    return max(abs(complex(value).real) for point, _ in _probe_points(intervals, math.inf) for value in evaluate(*point))


def _coordinate_search(evaluate, symbols, given: dict, start: tuple[float, float], largest: float):
    """Intervals for ``symbols`` (``given`` ones fixed, the others from ``start``), each the
    first candidate on which the whole box is moderate (values at most ``largest``) with the
    others' current choices, in two passes; and the symbol for which no candidate was, or None."""
    chosen = {s: given.get(s.name, start) for s in symbols}
    passes = 2  # a second pass lets each symbol adapt to the others' choices
    for attempt in range(passes):
        for symbol in symbols:
            if symbol.name in given:
                continue
            for candidate in DOMAIN_CANDIDATES:
                trial = {**chosen, symbol: candidate}
                if _all_moderate(evaluate, [trial[s] for s in symbols], largest):
                    chosen[symbol] = candidate
                    break
            else:
                if attempt == passes - 1 or len(symbols) == 1:
                    return chosen, symbol
                # else: another symbol's interval may be what is wrong (x*log(y) fails for every
                # x while y is still on (-3, 3)); the next pass tries again.
    return chosen, None


def _probe_points(intervals: list[tuple[float, float]], largest: float):
    """The probe points in a box, each with the largest size allowed there: a Kronecker
    sequence (deterministic, well spread, and free of the round numbers (0, 1) where many
    singularities sit and through which no real sample would pass), sizes up to
    ``largest``; then the corners, 1% inside, which need only be real and finite. A
    function can fail in one corner only: log(z + 1 - tanh(z) + tanh(y)) is NaN for z
    near -3 whatever y, and no interior probe came that close while gradcheck's samples did.
    (A sum of 40 cubic terms is over 1000 in a corner of (-3, 3)**3, and fine to sample.)"""
    steps = [math.sqrt(p) % 1 for p in (2, 3, 5, 7, 11, 13, 17, 19)]
    for k in range(1, DOMAIN_PROBES * len(intervals) + 1):
        point = [lo + (hi - lo) * ((k * steps[i % len(steps)] + 0.5 * i) % 1) for i, (lo, hi) in enumerate(intervals)]
        yield point, largest
    if len(intervals) <= DOMAIN_CORNER_MAX_INPUTS:
        for corner in itertools.product((0.01, 0.99), repeat=len(intervals)):
            yield [lo + (hi - lo) * f for f, (lo, hi) in zip(corner, intervals)], math.inf


# Boxes of more inputs skip the corner probes (2**n of them).

DOMAIN_CORNER_MAX_INPUTS = 6


def _all_moderate(evaluate, intervals: list[tuple[float, float]], largest: float) -> bool:
    return _first_failure(evaluate, intervals, largest) is None


def _first_failure(evaluate, intervals: list[tuple[float, float]], largest: float) -> list[float] | None:
    """The first probe point at which a value is not real, finite and moderate, or None."""
    for point, bound in _probe_points(intervals, largest):
        try:
            values = evaluate(*point)
        except PROBE_FAILURES:
            return point
        if not all(moderate(value, bound) for value in values):
            return point
    return None
