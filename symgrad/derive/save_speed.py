"""``--save speed``: forward computes the derivatives along with the outputs where they share
work, and backward only multiplies (:func:`with_derivatives_as_outputs`).
"""

from __future__ import annotations

import sympy

from ..errors import SymgradError
from ..frontend.parse import Output, Parsed
from ..math.accuracy import _as_accurate
from ..math.functions import sigmoid
from ..math.numbers import numbers_to_floats
from ..math.rounding import round_half_even
from ..math.simplify import op_count
from ..rewrite.cost import CostModel, _minus_abs, _positive, reuse_shared_work
from ..rewrite.kernels import whole_gradient_kernel
from .derivation import Derivation
from .second_order import _second_derivatives, autograd_loses_second_derivatives


# A derivative this cheap (by op_count) is recomputed in backward even under --save speed:
# computing it in forward as well would save one tensor more and no time.

SPEED_MIN_OPS = 2


# Work below this is cheap enough that a fused kernel recomputes it for free: sharing it is
# no reason to write a derivative out and read it back (sqrt(x) and 1/x in sqrt(x) + 1/x).

_CHEAP_FUNCTIONS = (sympy.Abs, sympy.sign, sympy.Heaviside, sympy.Piecewise, sympy.floor, sympy.ceiling, round_half_even)


def _shares_work(forward: tuple[sympy.Expr, ...], derivative: sympy.Expr, fused: bool = False) -> bool:
    """Whether computing ``derivative`` next to ``forward`` reuses any of forward's work.

    Only then does returning it from forward save time: otherwise its cost just moves from
    backward to forward, plus a tensor written and read back (3*x**2 next to x**3). In a
    fused kernel memory traffic dominates arithmetic, so there the shared work must include
    a transcendental function (exp, tanh, erf, ...).
    """
    temps, reduced = sympy.cse(list(forward) + [derivative], order="canonical")
    definitions = dict(temps)

    def closure(exprs) -> set[sympy.Symbol]:
        seen: set[sympy.Symbol] = set()
        stack = [s for e in exprs for s in e.free_symbols if s in definitions]
        while stack:
            symbol = stack.pop()
            if symbol not in seen:
                seen.add(symbol)
                stack += [s for s in definitions[symbol].free_symbols if s in definitions]
        return seen

    shared = closure(reduced[:-1]) & closure(reduced[-1:])
    if fused:
        return any(
            isinstance(node, sympy.Function) and not isinstance(node, _CHEAP_FUNCTIONS)
            for temp in shared
            for node in sympy.preorder_traversal(definitions[temp])
        )
    return bool(shared)


def _sigmoids_split(forward: tuple[sympy.Expr, ...], derivative: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """``forward`` with sigmoid(u) and sigmoid(-u) computed from the s = sigmoid(-|u|) that
    ``derivative`` calls (cheaper_fused_form's sigmoid pair), where each output stays as
    accurate in float32; else ``forward`` itself.

    sigmoid(u) is torch.where(u > 0, 1 - s, s): exact on each side, since s <= 1/2 and so
    1 - s loses nothing. Then forward and the derivative share their one sigmoid, and a
    fused --save speed forward returns the derivative, where backward would otherwise call
    a sigmoid of its own: Sigmoid's module took 0.78x the time at 1e7 float32 on a CPU
    (benchmarks/README.md, A/B), 1.15x torch.compile's inexact y*(1 - y) where it took 1.49x.
    Fused only: in an eager body the where and 1 - s are passes over memory of their own.
    """
    rules = {}
    for node in sympy.preorder_traversal(derivative):
        if not (isinstance(node, sigmoid) and isinstance(node.args[0], sympy.Piecewise)):
            continue
        u = node.args[0].args[-1].expr
        positive = _positive(u)
        if positive is None or node.args[0] != _minus_abs(u):
            continue
        rules[sigmoid(u)] = sympy.Piecewise((1 - node, positive), (node, True))
        rules[sigmoid(-u)] = sympy.Piecewise((node, positive), (1 - node, True))
    if not rules:
        return forward
    split = tuple(expr.xreplace(rules) for expr in forward)
    if any(new != old and not _as_accurate(new, old) for new, old in zip(split, forward)):
        return forward
    return split


def with_derivatives_as_outputs(derivation: Derivation) -> Derivation:
    """--save speed: forward also returns each costly derivative, sharing work with the output.

    This is the pattern the PyTorch docs give for saving intermediates with setup_context:
    an intermediate backward needs is returned as an output. It stays differentiable, so
    double backward is exact: backward adds ``grad_derivative * (second derivative)``.
    The derivative outputs' own gradient rows are those second derivatives.
    """
    parsed = derivation.parsed
    forward = derivation.forward
    derivatives: list[list[tuple[int, int]]] = []
    identities = set(derivation.identities)
    second, returned = [], []
    recomputed: list[tuple[int, int, sympy.Expr]] = []  # gradients backward computes again
    for i, row in enumerate(derivation.gradients):
        for j, gradient in enumerate(row):
            if derivation.nondifferentiable[i]:
                continue
            if op_count(gradient) < SPEED_MIN_OPS:
                recomputed.append((i, j, gradient))
                continue
            if not numbers_to_floats(gradient).free_symbols:
                # Constant, perhaps only once printed with float constants (erf(30)**y is
                # 1.0**y): forward could not return it as a tensor.
                continue
            # Computed in forward now, next to the outputs: reuse their work where accurate.
            gradient = reuse_shared_work(gradient, list(forward) + [gradient])
            if gradient in forward:
                continue  # exp(x + 1): the output itself, which backward reuses anyway
            if gradient in returned:
                derivatives[returned.index(gradient)].append((i, j))  # one tensor, returned once
                continue
            if not _shares_work(forward, gradient, fused=parsed.spec.fuse):
                if not parsed.spec.fuse:
                    recomputed.append((i, j, gradient))
                    continue
                split = _sigmoids_split(forward, gradient)
                if split == forward or not _shares_work(split, gradient, fused=True):
                    recomputed.append((i, j, gradient))
                    continue
                forward = split
                identities.add("sigmoid_split")
            found = whole_gradient_kernel(parsed.spec, parsed.inputs, parsed.params, _terms_reaching(derivation, j))
            if found is not None:
                # One ATen kernel computes it in backward (symgrad.rewrite.kernels): faster than
                # computing it in forward and multiplying, and nothing more is saved.
                continue
            row = _returned_derivative_row(derivation.raw_gradients[i][j], gradient, parsed, identities, derivation.costs)
            if row is None:
                continue
            second.append(row)
            returned.append(gradient)
            derivatives.append([(i, j)])
    if not derivatives:
        return derivation
    # Once forward returns a derivative, backward has no create_graph branch (double backward
    # differentiates the returned ones symbolically): a gradient it computes again is
    # differentiated by autograd, so one whose autograd derivative would be wrong is returned
    # too. (softplus's sigmoid(x) in log(1 + exp(x)) + y*exp(y), next to its returned
    # y-gradient: autograd's y*(1 - y) made d2/dx2 0 at x = 20 in float32, where it is 2.1e-9.)
    for i, j, gradient in recomputed:
        raw = derivation.raw_gradients[i][j]
        if not autograd_loses_second_derivatives(gradient, raw, parsed.inputs):
            continue
        gradient = reuse_shared_work(gradient, list(forward) + [gradient])
        if gradient in forward:
            continue
        if gradient in returned:
            derivatives[returned.index(gradient)].append((i, j))
            continue
        row = _returned_derivative_row(raw, gradient, parsed, identities, derivation.costs)
        if row is None:
            continue
        second.append(row)
        returned.append(gradient)
        derivatives.append([(i, j)])
    # (in the gradients' order, as without the pass above: dresult_dx before dresult_dy)
    order = sorted(range(len(derivatives)), key=lambda k: derivatives[k][0])
    derivatives, second, returned = ([seq[k] for k in order] for seq in (derivatives, second, returned))
    extra_outputs = tuple(Output(gradient) for gradient in returned)
    return Derivation(
        parsed=Parsed(**{**parsed.__dict__, "outputs": parsed.outputs + extra_outputs}),
        forward=forward + tuple(out.expr for out in extra_outputs),
        gradients=derivation.gradients + tuple(second),
        surrogate=derivation.surrogate,
        nondifferentiable=derivation.nondifferentiable + (False,) * len(second),
        domain=derivation.domain,
        derivatives=tuple(tuple(entries) for entries in derivatives),
        raw_gradients=derivation.raw_gradients,
        documented_gradients=derivation.documented_gradients,
        identities=tuple(sorted(identities)),
    )


def _returned_derivative_row(
    raw: sympy.Expr, gradient: sympy.Expr, parsed: Parsed, identities: set[str], costs: CostModel
):
    """The second derivatives of a gradient forward would return (_second_derivatives, its
    forms chosen by ``costs``), adding the identities used to ``identities``; None where backward recomputes it
    instead."""
    row_identities: set[str] = set()
    try:
        row = _second_derivatives(raw, gradient, parsed.inputs, parsed.spec.fuse, row_identities, costs)
    except SymgradError:
        return None  # SymPy cannot differentiate it again: backward recomputes this one
    if any(g.has(sympy.AccumBounds) for g in row):
        # An interval where a value should be (see _refuse_interval_values): backward
        # recomputes this one, and autograd differentiates that.
        return None
    if all(g == 0 for g in row):
        # Piecewise constant (3*sign(x)): cheap to recompute, and it may even fold to a
        # number while printing, which forward could not return as a tensor.
        return None
    identities |= row_identities
    return row


def _terms_reaching(derivation: Derivation, j: int) -> list[tuple[sympy.Expr, str | None]]:
    """(derivative, reduction) of each differentiable output whose gradient reaches input j."""
    return [
        (row[j], output.reduction)
        for row, output, constant in zip(derivation.gradients, derivation.parsed.outputs, derivation.nondifferentiable)
        if not constant and row[j] != 0
    ]
