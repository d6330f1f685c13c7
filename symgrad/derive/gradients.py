"""Stage 2: gradients, bounded simplification, stability rewrites and sampling domains
(:func:`derive`).
"""

from __future__ import annotations

import sympy

from ..errors import SymgradError
from ..frontend.parse import Parsed
from ..math.functions import ForwardKernel, sigmoid, to_elementary
from ..math.numbers import numbers_to_floats
from ..math.simplify import _shown, cheapest_form
from ..rewrite.cost import CPU_COSTS, CostModel, cheaper_forms, reuse_shared_work
from ..rewrite.engine import stabilize
from ..rewrite.kernels import with_forward_kernels
from ..rewrite.patterns import same_number
from ..rewrite.roots import real_abs_powers
from .derivation import Derivation
from .differentiate import _differentiate
from .domain import sampling_domain


def _elementary_or_self(expr: sympy.Expr) -> sympy.Expr:
    """to_elementary(expr), or expr itself where SymPy cannot rebuild it: rewriting a
    Piecewise whose condition compares a non-real value (zoo, or log of a negative
    number) raises TypeError in SymPy 1.14."""
    try:
        return to_elementary(expr)
    except (TypeError, ValueError, ArithmeticError):
        return expr


def derive(parsed: Parsed, costs: CostModel = CPU_COSTS) -> Derivation:
    """Differentiate every output by every input, simplify within bounds, stabilise, and
    choose the forms that cost least by ``costs``."""
    surrogates = dict(parsed.surrogates)
    forward = tuple(stabilize(out.expr, root_sums=True) for out in parsed.outputs)
    identities: set[str] = set()
    if not parsed.spec.fuse:
        forward = _with_forward_kernels(forward, identities, parsed)
    forward = cheaper_forms(forward, identities, parsed.spec.fuse, costs)
    for index, expr in enumerate(forward):
        folded = numbers_to_floats(_elementary_or_self(expr))
        if not folded.free_symbols & set(parsed.inputs):
            # The generated code uses float constants, with which SymPy decides comparisons
            # it left open exactly: Max(2, acos(1/2) - abs(x)) is 2, and (x + pi*x)/x, a
            # removable singularity at 0 exactly, is 4.14159... (the
            # second printed torch.where of two numbers, of the default dtype).
            where = f"output {index + 1}" if len(forward) > 1 else "the expression"
            raise SymgradError(f"{where} is constant ({folded}) for every input, so it has no gradient")
    complemented = [_sigmoid_complements(out.expr) for out in parsed.outputs]
    raw = tuple(
        tuple(
            surrogates[symbol] if symbol in surrogates else real_abs_powers(cheapest_form(_differentiate(expr, symbol)))
            for symbol in parsed.inputs
        )
        for expr in complemented
    )
    stable = [tuple(stabilize(g) for g in row) for row in raw]
    _refuse_interval_values(parsed, stable)
    # The docstring shows the stable forms the identities apply to (eager ones with the work
    # they reuse, 1 - sigmoid(x) for sigmoid(-x), as the code has it: that is no identity the
    # docstring lists; the fused forms' reuse happens after their identities).
    documented = stable if parsed.spec.fuse else _reusing_shared_work(stable)
    gradients = _reusing_shared_work([cheaper_forms(row, identities, parsed.spec.fuse, costs) for row in stable])
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
        raw_gradients=raw,
        documented_gradients=tuple(documented),
        identities=tuple(sorted(identities)),
        costs=costs,
    )
    return Derivation(**{**derivation.__dict__, "domain": sampling_domain(derivation)})


def _with_forward_kernels(forward: tuple[sympy.Expr, ...], identities: set[str], parsed: Parsed) -> tuple[sympy.Expr, ...]:
    """Each eager forward expression with ATen's activation kernels (kernels.with_forward_kernels),
    adding the identities used. Only forward: the gradients are derived from the outputs as
    parsed, and a backward kernel (symgrad.rewrite.kernels) computes the first-order ones.

    With --save speed, only a whole output that is one kernel call of the single input:
    then a backward kernel computes its gradient. Elsewhere forward returns a derivative
    that shares the formula's work, and the kernel would leave it none to share
    (sum(x*tanh(softplus(x))) with --save speed took 1.27x the time).
    """
    if parsed.spec.save == "speed":
        if len(parsed.inputs) != 1 or parsed.params or len(forward) != 1 or parsed.outputs[0].reduction is not None:
            return forward
        expr, used = with_forward_kernels(forward[0])
        if not (isinstance(expr, ForwardKernel) and expr.args[0] == parsed.inputs[0]):
            return forward
        identities |= used
        return (expr,)
    results = []
    for k, expr in enumerate(forward):
        expr, used = with_forward_kernels(expr, forward[:k] + forward[k + 1 :])
        identities |= used
        results.append(expr)
    return tuple(results)


def _sigmoid_complements(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ``c - c*sigmoid(u)`` as ``c*sigmoid(-u)``, before differentiating.

    The derivative of ``log(1 - sigmoid(u))`` is then ``-sigmoid(u)*sigmoid(-u)/sigmoid(-u)``,
    which SymPy cancels as it builds it. Differentiated as written, it divided by
    ``1 - sigmoid(u)``, and the cost-guarded simplification factored the sigmoid(-u) of the
    other terms out of the sum: the binary focal loss's gradient,
    ``sigmoid(-x)*(sigmoid(x)**3/sigmoid(-x) + ...)``, was 0*inf = nan from x = 89 in float32.
    """

    def complement(node: sympy.Basic) -> sympy.Basic:
        if isinstance(node, sympy.logic.boolalg.Boolean):
            return node  # (conditions stay as written: forward takes its branches by them)
        args = tuple(map(complement, node.args))
        if args != node.args:
            node = node.func(*args)
        if not node.is_Add:
            return node
        constant, rest = node.as_coeff_Add()
        for term in sympy.Add.make_args(rest) if constant != 0 else ():
            coeff, f = term.as_coeff_Mul()
            if isinstance(f, sigmoid) and same_number(constant, -coeff):  # (1.0 too)
                return rest - term + constant * sigmoid(-f.args[0])
        return node

    return complement(expr)


def _refuse_interval_values(parsed: Parsed, gradients: list[tuple[sympy.Expr, ...]]) -> None:
    """Refuse a stabilised gradient that holds an AccumBounds (an interval, not a value).

    Folding guards at a branch's edge can meet atanh(-oo) = I*AccumBounds(-pi/2, pi/2), which
    nothing could print. A nan branch at a single point,
    Piecewise((nan, Eq(x, 1)), ...), is printed and harmless, so nan is not refused here.
    """
    for out, row in zip(parsed.outputs, gradients):
        for symbol, gradient in zip(parsed.inputs, row):
            if gradient.has(sympy.AccumBounds):
                raise SymgradError(
                    f"the derivative of {_shown(out.expr)} by {symbol} is complex or undefined: {_shown(gradient)}"
                )


def _reusing_shared_work(gradients: list[tuple[sympy.Expr, ...]]) -> list[tuple[sympy.Expr, ...]]:
    """Backward computes all gradients together (one CSE): let them reuse each other's work."""
    context = [g for row in gradients for g in row]
    return [tuple(reuse_shared_work(g, context) for g in row) for row in gradients]
