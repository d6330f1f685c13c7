"""Numerically stable rewrites, applied to forward expressions and derivatives alike.

A rewrite applied only to the forward comes back in the derivative (d/dx log1p(u) is
u'/(1+u) again), so :func:`stabilize` runs after differentiation and simplification too.
SymPy's ``sympy.codegen.rewriting`` supplies ``log1p`` and ``expm1``.
"""

from __future__ import annotations

import sympy
from sympy.codegen.rewriting import expm1_opt, log1p_opt, optimize

_SYMPY_REWRITES = (expm1_opt, log1p_opt)


def stabilize(expr: sympy.Expr) -> sympy.Expr:
    """Rewrite ``expr`` into an equal form that is finite and accurate on more inputs."""
    return optimize(expr, _SYMPY_REWRITES)
