"""An independent mpmath evaluation of row-wise formulas (reductions along a dim, softmax,
gather, chunk), for tests/test_rowwise.py and tests/test_range_rowwise.py.

The formula is the parsed expression before any rewrite. Reductions are numpy's over exact
mpmath values; every other node goes through its SymPy definition lambdified to mpmath. It
shares nothing with symgrad's printer, rewrites or derivatives."""

from __future__ import annotations

import functools

import mpmath
import numpy as np
import sympy

from symgrad.math import reductions as r


@functools.lru_cache(maxsize=None)
def _scalar(func, arity: int):
    """``func`` of ``arity`` arguments as an mpmath function, elementwise over object arrays."""
    dummies = sympy.symbols(f"a0:{arity}", real=True)
    return np.vectorize(sympy.lambdify(dummies, func(*dummies), "mpmath"), otypes=[object])


# exp, log and sqrt over object arrays: of mpmath numbers, or of SymPy scalars.
_MPMATH = tuple(np.vectorize(f, otypes=[object]) for f in (mpmath.exp, mpmath.log, mpmath.sqrt))
_SYMPY = tuple(np.vectorize(f, otypes=[object]) for f in (sympy.exp, sympy.log, sympy.sqrt))


def _row(node, value: np.ndarray, env: dict, functions) -> np.ndarray:
    """A row function of ``value`` (an object array), with ``functions`` = (exp, log, sqrt)."""
    exp, log, sqrt = functions
    if isinstance(node, r.Gather):
        index = np.asarray(env[node.index]).astype(int)[..., None]
        return np.take_along_axis(value, index, axis=-1)
    if isinstance(node, r.Chunk):
        return np.split(value, node.count, axis=-1)[node.index]
    axes = tuple(int(d) for d in node.dims) if node.args[1] else None
    keep = axes is not None
    total = lambda v: np.sum(v, axis=axes, keepdims=keep)  # noqa: E731
    if isinstance(node, r.ReduceSum):
        return total(value)
    if isinstance(node, r.ReduceMean):
        return total(value) / (value.size if axes is None else int(np.prod([value.shape[a] for a in axes])))
    if isinstance(node, r.ReduceMax):
        return np.max(value, axis=axes, keepdims=keep)
    if isinstance(node, r.ReduceMin):
        return np.min(value, axis=axes, keepdims=keep)
    if isinstance(node, r.LogSumExp):
        return log(total(exp(value)))
    if isinstance(node, r.Norm):
        return sqrt(total(value * value))
    if isinstance(node, r.LogSoftmax):
        return value - log(total(exp(value)))
    if isinstance(node, r.Softmax):
        return exp(value) / total(exp(value))
    raise AssertionError(f"{type(node).__name__} is not evaluated here")


def mp_eval(expr: sympy.Basic, env: dict) -> np.ndarray:
    """``expr`` at ``env`` (symbol -> numpy object array of mpmath numbers, or of ints for a
    gather's index, or an mpmath number), at the caller's mpmath precision."""

    def ev(node):
        if node in env:
            return env[node]
        if node.is_Number or node in (sympy.pi, sympy.E):
            return mpmath.mpf(sympy.N(node, mpmath.mp.dps + 10))
        if isinstance(node, r.RowFunction):
            return _row(node, ev(node.operand), env, _MPMATH)
        args = [ev(a) for a in node.args]
        return _scalar(node.func, len(args))(*np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in args]))

    return ev(expr)


def sympy_rows(expr: sympy.Basic, env: dict) -> np.ndarray:
    """``expr`` written out over ``env``'s scalars (symbol -> numpy object array of SymPy
    scalars or ints): every reduction as an explicit sum, max or min over its entries, so
    that SymPy differentiates the result exactly, entry by entry."""

    def ev(node):
        if node in env:
            return env[node]
        if node.is_Number or node in (sympy.pi, sympy.E):
            return node
        if isinstance(node, r.RowFunction):
            return _row(node, np.asarray(ev(node.operand), dtype=object), env, _SYMPY)
        args = [np.asarray(ev(a), dtype=object) for a in node.args]
        apply = np.vectorize(lambda *a: node.func(*a), otypes=[object])
        return apply(*np.broadcast_arrays(*args))

    return np.asarray(ev(expr), dtype=object)
