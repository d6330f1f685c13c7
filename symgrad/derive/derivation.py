"""The stage-2 result, :class:`Derivation`."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..frontend.parse import Parsed
from ..rewrite.cost import CPU_COSTS, CostModel


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
    # --save speed: outputs past the user's are derivatives that forward computes along with
    # them; entry k lists the (output i, input j) whose d(output i)/d(input j) is output
    # ``len(parsed.outputs) + k`` (several when equal: d/dx and d/dy of cos(x + y)).
    derivatives: tuple[tuple[tuple[int, int], ...], ...] = ()
    # Each derivative's unstabilised form, for differentiating it again.
    raw_gradients: tuple[tuple[sympy.Expr, ...], ...] = ()
    # The user's outputs' gradients as the docstring states them: the stable forms that
    # cheaper_fused_form and cheaper_eager_form rewrite (tanh(softplus(x)), not its quotient).
    documented_gradients: tuple[tuple[sympy.Expr, ...], ...] = ()
    # The IDENTITIES the bodies use, for the docstring (a reader of the code meets sigmoid
    # quotients where the math has tanh).
    identities: tuple[str, ...] = ()
    # What kernel calls cost on the target, for the choices of form made after this stage
    # (exact_second_derivatives).
    costs: CostModel = CPU_COSTS
