"""Cheaper equal forms, chosen by a cost model: :class:`CostModel` weighs each kernel call,
:func:`cheaper_eager_form` and :func:`cheaper_fused_form` rewrite calls that cost less
another way where that stays accurate, and :func:`reuse_shared_work` lets gradients reuse
the calls that other gradients make.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..math.accuracy import _as_accurate
from ..math.functions import sigmoid, softplus


@dataclass(frozen=True)
class CostModel:
    """What kernel calls cost on a target, for choosing between equal forms of a formula.

    The rules that propose the forms (:func:`cheaper_eager_form`) ask the model which form
    is cheaper, so a target with other costs (a GPU) is another instance, not other rules.

    Args:
        name: a short label for the target, e.g. ``"cpu"``.
        eager_call_costs: ``(call, cost)`` pairs: what one eager kernel of the call costs,
            relative to an arithmetic operation (``x*0.5``, ``-x``, ``x**2``), the call named
            as SymPy's ``count_ops(visual=True)`` names it (``"TANH"``). Other calls cost 1.
    """

    name: str
    eager_call_costs: tuple[tuple[str, float], ...]

    def eager_cost(self, expr: sympy.Expr) -> float:
        """:func:`~symgrad.math.simplify.op_count` with each call weighted by its eager cost."""
        costs = dict(self.eager_call_costs)
        visual = sympy.count_ops(expr, visual=True)
        return float(visual.xreplace({s: sympy.Float(costs.get(s.name, 1.0)) for s in visual.free_symbols}))


# The calls whose cost sets a choice of form below, measured with ATen on a CPU, 1 thread,
# 1e7 float32 values: -x 2.5 ms, sigmoid 4.2, exp 8.4, cosh 13.3, softplus 16.0, tanh 25.5.
# (SymPy's count_ops, op_count, counts every call as one.) Allocations are not counted: with
# glibc's default allocator a new 40 MB buffer costs more than the kernel that fills it.
CPU_COSTS = CostModel(
    name="cpu",
    eager_call_costs=(("SIGMOID", 1.5), ("EXP", 3.0), ("COSH", 5.0), ("SOFTPLUS", 6.5), ("TANH", 9.0)),
)


def _sech_as_sigmoid_pairs(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each 1/cosh(u)**(2k) (_is_sech_power) as (4*sigmoid(2u)*sigmoid(-2u))**k."""
    rules = {
        node: (4 * sigmoid(2 * node.base.args[0]) * sigmoid(-2 * node.base.args[0])) ** (-node.exp // 2)
        for node in sympy.preorder_traversal(expr)
        if _is_sech_power(node)
    }
    return expr.xreplace(rules) if rules else expr


def reuse_shared_work(expr: sympy.Expr, context: list[sympy.Expr]) -> sympy.Expr:
    """``expr`` with transcendental calls that ``context`` already makes reused, if accurate.

    The stable forms of derivatives call sigmoid(-u) next to sigmoid(u) (SiLU) and
    cosh(u)**-2 next to tanh(u) (Mish): two more exp-based kernels. Written as 1 - sigmoid(u)
    and 1 - tanh(u)**2 they reuse the call (torch's own silu and tanh backward do this). That
    loses relative accuracy where the reused value is near 1, so the rewrite is kept only if
    the whole expression stays within REUSE_MAX_ULPS in float32 arithmetic.
    """
    rules = {}
    for node in (n for e in context for n in sympy.preorder_traversal(e)):
        if isinstance(node, sigmoid) and not node.args[0].could_extract_minus_sign():
            rules[sigmoid(-node.args[0])] = 1 - node  # (one direction only: not back again)
        elif isinstance(node, sympy.tanh):
            rules[sympy.cosh(node.args[0]) ** -2] = 1 - node**2
    rules = {old: new for old, new in rules.items() if old != new and expr.has(old)}
    if not rules:
        return expr
    candidate = expr.xreplace(rules)
    return candidate if _as_accurate(candidate, expr) else expr


# What cheaper_fused_form and cheaper_eager_form rewrite, as a module's docstring states it.

IDENTITIES = {
    "sech": "1/cosh(u)**2 = 4*s*(1 - s), with s = sigmoid(-2*|u|)",
    "sech_sigmoids": "1/cosh(u)**2 = 4*sigmoid(2*u)*sigmoid(-2*u)",
    "sigmoid_pair": "sigmoid(u)*sigmoid(-u) = s*(1 - s), with s = sigmoid(-|u|)",
    "sigmoid_split": "sigmoid(u) = 1 - s if u > 0 else s, with s = sigmoid(-|u|)",
    "tanh_softplus": "tanh(softplus(u)) = s*(2 - s)/(1 + (1 - s)**2), with s = sigmoid(u)",
    "cosh_softplus": "cosh(softplus(u)) = (1 + (1 - s)**2)/(2*(1 - s)), with s = sigmoid(u)",
    # (kernels.FORWARD_KERNELS: forward only)
    "mish": "u*tanh(softplus(u)) = torch.nn.functional.mish(u), in forward",
    "silu": "u*sigmoid(u) = torch.nn.functional.silu(u), in forward",
    "log_sigmoid": "-softplus(-u) = torch.nn.functional.logsigmoid(u), in forward",
}


def cheaper_forms(
    exprs: tuple[sympy.Expr, ...], identities: set[str], fuse: bool, costs: CostModel = CPU_COSTS
) -> tuple[sympy.Expr, ...]:
    """cheaper_fused_form (``fuse``) or cheaper_eager_form (by ``costs``) of each, adding the
    names of the identities used to ``identities``."""
    results = []
    for expr in exprs:
        cheaper, used = _cheaper_fused_form(expr) if fuse else _cheaper_eager_form(expr, costs)
        identities |= used
        results.append(cheaper)
    return tuple(results)


def cheaper_fused_form(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with calls a fused kernel computes more cheaply another way, if accurate.

    For fused modules, whose bodies run as one compiled kernel: there an exp is cheap and
    tanh, cosh and log1p are not (inductor on a CPU, per 1e7 float32 values: exp 3.4 ms,
    sigmoid 4.5, log1p 8.5, cosh 13.4, tanh 15.3), so these forms are always cheaper. Eager
    bodies, where each operation is a kernel of its own with a pass over memory, use the
    ones that cost less there (cheaper_eager_form).

    - sigmoid(u)*sigmoid(-u) (the derivative of sigmoid) becomes s*(1 - s) with
      s = sigmoid(-|u|): one sigmoid for two, accurate since s <= 1/2. 1/cosh(u)**2 (the
      derivative of tanh) is 4*sigmoid(2u)*sigmoid(-2u), so it becomes one sigmoid too.
    - tanh(softplus(u)) (Mish) becomes s*(2 - s)/(1 + (1 - s)**2) with s = sigmoid(u), since
      exp(softplus(u)) = 1/(1 - s): one exp and a few divides instead of exp, log1p and
      tanh, and the derivative's own sigmoid(u) is the same s. cosh(softplus(u)) likewise.
      These lose accuracy where 1 - s does, so they are kept only if the whole expression
      stays within REUSE_MAX_ULPS in float32 arithmetic.

    -|u| is written as torch.where(u > 0, -u, u), not with abs: on each side the form is
    the analytic function itself, so autograd differentiates the eager body (double
    backward) as that formula, to every order, at u = 0 too, where abs's derivative would
    be 0.

    (tanh itself stays: the one-call alternative, -m/(2 + m) with m = expm1(-2|u|), loses
    all accuracy near 0 once compiled, since inductor's CPU code computes expm1 as exp - 1;
   .)
    """
    return _cheaper_fused_form(expr)[0]


def _cheaper_fused_form(expr: sympy.Expr) -> tuple[sympy.Expr, frozenset[str]]:
    """cheaper_fused_form(expr), and the names (IDENTITIES) of the identities it used.

    The sech and sigmoid forms repeat their argument (in the where's condition and both
    branches), so each rewrites only calls whose argument holds no call it rewrites itself:
    nested, the copies would multiply (tanh(tanh(tanh(tanh(x)))) hung with a tanh form now
    withdrawn). The outer calls keep their own kernels.
    """
    used = set()
    paired = _sigmoid_pairs(expr)
    if paired != expr:
        expr = paired
        used.add("sigmoid_pair")
    sech = expr.xreplace(
        {
            node: _sech_squared(node.base.args[0]) ** (-node.exp // 2)
            for node in sympy.preorder_traversal(expr)
            if _is_sech_power(node) and not node.base.args[0].has(sympy.cosh) and _positive(node.base.args[0]) is not None
        }
    )
    if sech != expr:
        expr = sech
        used.add("sech")
    candidate, softplus_rules = _softplus_identities(expr)
    if softplus_rules and _as_accurate(candidate, expr):
        expr, used = candidate, used | softplus_rules
    return expr, frozenset(used)


def _softplus_identities(expr: sympy.Expr) -> tuple[sympy.Expr, set[str]]:
    """``expr`` with tanh(softplus(u)) and cosh(softplus(u)) rational in s = sigmoid(u), and
    the names of the identities used (not checked for accuracy: see _as_accurate)."""
    candidate, used = expr, set()
    for _ in range(4):  # nested: x*tanh(softplus(x*tanh(softplus(x)))) needs two rounds
        rules = {}
        for node in sympy.preorder_traversal(candidate):
            if isinstance(node, (sympy.tanh, sympy.cosh)) and isinstance(node.args[0], softplus):
                s = sigmoid(node.args[0].args[0])
                if isinstance(node, sympy.tanh):
                    rules[node] = s * (2 - s) / (1 + (1 - s) ** 2)
                else:  # its derivative's 1/cosh(softplus(u))**2: cosh(log(w)) = (w + 1/w)/2
                    rules[node] = (1 + (1 - s) ** 2) / (2 * (1 - s))
                used.add(f"{type(node).__name__}_softplus")
        if not rules:
            break
        candidate = candidate.xreplace(rules)
    return candidate, used


def cheaper_eager_form(expr: sympy.Expr, costs: CostModel = CPU_COSTS) -> sympy.Expr:
    """``expr`` with calls that eager kernels compute more cheaply another way, if accurate.

    Each candidate is kept only if it costs less by ``costs``' :meth:`CostModel.eager_cost`,
    which weighs the slow kernels (cosh, tanh, softplus) by their measured time.

    - 1/cosh(u)**(2k) becomes (4*sigmoid(2u)*sigmoid(-2u))**k. The sigmoid's derivative is
      1/(4*cosh(x/2)**2) after simplification; as sigmoid(x)*sigmoid(-x) it runs two cheap
      sigmoid kernels instead of the scaling, a slow cosh, a square and a divide (20.1 ms
      against 26.9 ms for the backward at 1e7 on this CPU, grad_output included). Both
      factors are accurate, so the product is, at every x. tanh's 1/cosh(x)**2 keeps its
      form here: the arguments 2x and -2x and the factor 4 cost more than the cosh saves
      (26.5 ms against 20.9). (But see differentiable_form.)
    - tanh(softplus(u)) and cosh(softplus(u)) (Mish and its derivative) become rational in
      s = sigmoid(u), as in cheaper_fused_form: a sigmoid and a few arithmetic kernels
      instead of softplus and tanh, the two slowest, and the derivative's own sigmoid(u) is
      the same s. Kept only where float32 rounding shows it accurate (_as_accurate).
    """
    return _cheaper_eager_form(expr, costs)[0]


def _cheaper_eager_form(expr: sympy.Expr, costs: CostModel) -> tuple[sympy.Expr, frozenset[str]]:
    """cheaper_eager_form(expr, costs), and the names (IDENTITIES) of the identities it used."""
    used = set()
    candidate = _sech_as_sigmoid_pairs(expr)
    if candidate != expr and costs.eager_cost(candidate) < costs.eager_cost(expr):
        expr = candidate
        used.add("sech_sigmoids")
    candidate, softplus_rules = _softplus_identities(expr)
    if softplus_rules and costs.eager_cost(candidate) < costs.eager_cost(expr) and _as_accurate(candidate, expr):
        expr, used = candidate, used | softplus_rules
    return expr, frozenset(used)


def _is_sech_power(node: sympy.Basic) -> bool:
    """Whether ``node`` is 1/cosh(u)**(2k) for a u that is not softplus (Mish's rule is cheaper)."""
    return (
        node.is_Pow
        and isinstance(node.base, sympy.cosh)
        and not isinstance(node.base.args[0], softplus)
        and node.exp.is_Integer
        and node.exp < 0
        and node.exp % 2 == 0
    )


def _sech_squared(u: sympy.Expr) -> sympy.Expr:
    """1/cosh(u)**2 = 4*sigmoid(2u)*sigmoid(-2u), with that pair as one sigmoid (_sigmoid_pairs)."""
    s = sigmoid(_minus_abs(2 * u))
    return 4 * s * (1 - s)


def _positive(u: sympy.Expr) -> sympy.Basic | None:
    """``u > 0``, or None where SymPy refuses to compare u, knowing it is not real.

    (The forms that split on the sign of u skip such an argument: sigmoid(acosh(x > 3)) has
    one.)
    """
    try:
        condition = u > 0
        # Building the Piecewise of _minus_abs folds a Piecewise inside u into the condition,
        # and SymPy may refuse that comparison only then.
        sympy.Piecewise((-u, condition), (u, True))
        return condition
    except TypeError:
        return None


def _minus_abs(u: sympy.Expr) -> sympy.Expr:
    """-|u| as a Piecewise (torch.where(u > 0, -u, u)): see cheaper_fused_form for why not abs."""
    return sympy.Piecewise((-u, _positive(u)), (u, True))


def _sigmoid_pairs(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each sigmoid(u)**p*sigmoid(-u)**p as (s*(1 - s))**p, s = sigmoid(-|u|).

    Only for a u that holds no sigmoid itself (see _cheaper_fused_form), and whose sigmoid(u)
    and sigmoid(-u) then remain nowhere else: SiLU's gradient sigmoid(x) + x*sigmoid(x)*sigmoid(-x)
    would call sigmoid(x) anyway, and reuse_shared_work makes its sigmoid(-x) 1 - sigmoid(x)
    where that is accurate.
    """
    arguments = {
        node.args[0]
        for node in sympy.preorder_traversal(expr)
        if isinstance(node, sigmoid) and not node.args[0].could_extract_minus_sign() and not node.args[0].has(sigmoid)
    }
    for u in sorted(arguments, key=sympy.default_sort_key):
        pair, mirror = sigmoid(u), sigmoid(-u)
        if not expr.has(mirror) or _positive(u) is None:
            continue
        s = sympy.Dummy("s")  # sigmoid(-|u|), once no pair is left: -|u| may be -u itself

        def is_pair_product(node: sympy.Basic, pair=pair, mirror=mirror) -> bool:
            if not node.is_Mul:
                return False
            powers = dict(factor.as_base_exp() for factor in node.args)
            return pair in powers and powers.get(mirror) == powers[pair]

        def one_sigmoid(node: sympy.Expr, pair=pair, mirror=mirror) -> sympy.Expr:
            powers = dict(factor.as_base_exp() for factor in node.args)
            rest = [factor for factor in node.args if factor.as_base_exp()[0] not in (pair, mirror)]
            return sympy.Mul(*rest, (s * (1 - s)) ** powers[pair])

        candidate = expr.replace(is_pair_product, one_sigmoid)
        if candidate != expr and not candidate.has(pair, mirror):
            expr = candidate.xreplace({s: sigmoid(_minus_abs(u))})
    return expr
