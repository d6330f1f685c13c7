"""Stage 2: gradients, bounded simplification, stability rewrites and sampling domains."""

from __future__ import annotations

import functools
import itertools
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import mpmath
import sympy
from sympy.codegen.cfunctions import expm1

from .errors import SymgradError
from .kernels import whole_gradient_kernel, with_forward_kernels
from .numbers import numbers_to_floats
from .parse import Output, Parsed
from .probe import FLOAT64_MAX, PROBE_FAILURES, moderate, probe_code, real_only, wrap_probe_calls
from .stable import has_difference_of_squares, has_offset_quotient, real_abs_powers, same_number, stabilize
from .stable_functions import ForwardKernel, TaylorPolynomial, expand_functions, hypot, hypot_plus, sigmoid, softplus, to_elementary

# simplify() is only tried on expressions (or Add terms) at most this big: on larger
# ones it can run for minutes (facts.md), and it rarely pays anyway.
SIMPLIFY_MAX_OPS = 40
# ... and not where the exponents of powers of sums add up to more than this: simplify
# expands them, so a tiny 1000*(x + y + z)**999 would never finish, and it puts the terms
# over one denominator, so 2*sinh(x)/(2*x + sinh(x))**3 + 6/(y**2 - x)**4 + ... (a second
# derivative, exponents 3 + 4 + 4) ran for minutes (both found by the fuzz campaign).
SIMPLIFY_MAX_POWER = 8
# ... nor where folding its Piecewise/Max/Min together makes more than this many branches:
# simplify folds them and then simplifies every branch (Piecewise(2) - Max(4 args) with a
# nested Piecewise ran for minutes; found by the fuzz campaign).
SIMPLIFY_MAX_BRANCHES = 8
# ... nor on Piecewise conditions of more comparisons than this, all together.
SIMPLIFY_MAX_COMPARISONS = 8
# ... nor where any power has an exponent above this: trigsimp factored the speed-mode
# second derivative of tanh(x**100), with x**198 and cosh(x**100)**-4, for minutes (found
# by the fuzz campaign).
SIMPLIFY_MAX_DEGREE = 32
# ... nor where a rational has a denominator above this, as a float constant becomes
# (1e-3 from expm1(log1p(1e-3)) is 1152921504606847/1152921504606846976): logcombine ran
# for minutes on a Heaviside of log(x - 1e-3) minus that (found by the fuzz campaign).
SIMPLIFY_MAX_DENOMINATOR = 10**12

# Candidate sampling intervals, tried in order; the first on which the function and its
# gradients are finite and moderate wins. Chosen to suit common domains: all reals,
# positive, the open unit interval, above one.
DOMAIN_CANDIDATES = ((-3.0, 3.0), (0.1, 3.0), (-0.9, 0.9), (1.1, 3.0), (0.1, 0.9), (-3.0, -0.1))
# Probe points per input or param: a region where the function is NaN is found by chance,
# and a fixed count thins out with each dimension (64 points in all missed a NaN region of
# 2% of a 3-input box a third of the time: two campaign finds).
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


def _elementary_or_self(expr: sympy.Expr) -> sympy.Expr:
    """to_elementary(expr), or expr itself where SymPy cannot rebuild it: rewriting a
    Piecewise whose condition compares a non-real value (zoo, or log of a negative
    number) raises TypeError in SymPy 1.14 (three crashes in fuzz campaign 35)."""
    try:
        return to_elementary(expr)
    except (TypeError, ValueError, ArithmeticError):
        return expr


def derive(parsed: Parsed) -> Derivation:
    """Differentiate every output by every input, simplify within bounds, stabilise."""
    surrogates = dict(parsed.surrogates)
    forward = tuple(stabilize(out.expr, root_sums=True) for out in parsed.outputs)
    identities: set[str] = set()
    if not parsed.spec.fuse:
        forward = _with_forward_kernels(forward, identities, parsed)
    forward = _cheaper_forms(forward, identities, parsed.spec.fuse)
    for index, expr in enumerate(forward):
        folded = numbers_to_floats(_elementary_or_self(expr))
        if not folded.free_symbols & set(parsed.inputs):
            # The generated code uses float constants, with which SymPy decides comparisons
            # it left open exactly: Max(2, acos(1/2) - abs(x)) is 2, and (x + pi*x)/x, a
            # removable singularity at 0 exactly, is 4.14159... (both found by the fuzz
            # campaign; the second printed torch.where of two numbers, of the default dtype).
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
    gradients = _reusing_shared_work([_cheaper_forms(row, identities, parsed.spec.fuse) for row in stable])
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
    )
    return Derivation(**{**derivation.__dict__, "domain": sampling_domain(derivation)})


def _with_forward_kernels(forward: tuple[sympy.Expr, ...], identities: set[str], parsed: Parsed) -> tuple[sympy.Expr, ...]:
    """Each eager forward expression with ATen's activation kernels (kernels.with_forward_kernels),
    adding the identities used. Only forward: the gradients are derived from the outputs as
    parsed, and a backward kernel (symgrad.kernels) computes the first-order ones.

    With --save speed, only a whole output that is one kernel call of the single input:
    then a backward kernel computes its gradient. Elsewhere forward returns a derivative
    that shares the formula's work, and the kernel would leave it none to share
    (sum(x*tanh(softplus(x))) with --save speed took 1.27x the time; found in review).
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
    ``sigmoid(-x)*(sigmoid(x)**3/sigmoid(-x) + ...)``, was 0*inf = nan from x = 89 in float32
    (found by an accuracy hunt).
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
    nothing could print (found by the fuzz campaign). A nan branch at a single point,
    Piecewise((nan, Eq(x, 1)), ...), is printed and harmless, so nan is not refused here.
    """
    for out, row in zip(parsed.outputs, gradients):
        for symbol, gradient in zip(parsed.inputs, row):
            if gradient.has(sympy.AccumBounds):
                raise SymgradError(
                    f"the derivative of {_shown(out.expr)} by {symbol} is complex or undefined: {_shown(gradient)}"
                )


def differentiable_form(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each 1/cosh(u)**(2k) as (4*sigmoid(2u)*sigmoid(-2u))**k: for a formula
    that only double backward runs, which autograd differentiates.

    autograd's derivative of cosh(u)**-2 is -2*sinh(u)*cosh(u)**-3, inf*0 = nan from |u| = 90
    in float32; the sigmoids' derivatives are finite (found by a double-backward survey:
    tanh's create_graph formula). First-order gradients keep the cosh where it is cheaper
    (cheaper_eager_form): its value is right where cosh overflows (inf**-2 = 0).
    """
    return _sech_as_sigmoid_pairs(expr)


def _sech_as_sigmoid_pairs(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each 1/cosh(u)**(2k) (_is_sech_power) as (4*sigmoid(2u)*sigmoid(-2u))**k."""
    rules = {
        node: (4 * sigmoid(2 * node.base.args[0]) * sigmoid(-2 * node.base.args[0])) ** (-node.exp // 2)
        for node in sympy.preorder_traversal(expr)
        if _is_sech_power(node)
    }
    return expr.xreplace(rules) if rules else expr


class _autograd_sigmoid(sigmoid):  # noqa: N801 (SymPy's naming)
    """sigmoid, differentiated as autograd differentiates torch.sigmoid: y*(1 - y), which is
    0 in float32 from u = 17, where the exact sigmoid(u)*sigmoid(-u) is 4e-8."""

    def fdiff(self, argindex=1):
        return self * (1 - self)


class _autograd_expm1(expm1):  # noqa: N801 (SymPy's naming)
    """expm1, differentiated as autograd differentiates torch.expm1: y + 1 (derivatives.yaml),
    which is 0 in float32 from u = -17, where the exact exp(u) is 4e-8 (the VAE's KL term
    (mu**2 + exp(lv) - 1 - lv)/2, whose gradient is expm1(lv)/2: found by an accuracy hunt)."""

    def fdiff(self, argindex=1):
        return self + 1


class _autograd_power(sympy.Function):  # noqa: N801 (SymPy's naming)
    """base**exponent, differentiated as autograd differentiates torch's pow and sqrt: into
    a factor of its own, exponent*base**(exponent - 1), times the rest of the chain.

    SymPy joins powers of one base, so its derivative of sqrt(1 - s) times s's (1 - s) is
    sqrt(1 - s), finite; autograd computes (1 - s) / (2*sqrt(1 - s)), 0/0 = nan where 1 - s
    has rounded to 0 (atan(exp(x**x))'s gradient reuses sqrt(1 - sigmoid(2*x**x)), and its
    double backward was nan from x = 2.9 in float64; found by fuzz campaign 4134).
    """

    nargs = 2

    def fdiff(self, argindex=1):
        base, exponent = self.args
        if argindex == 1:
            return exponent * _autograd_power(base, exponent - 1)
        return self * sympy.log(base)

    def _eval_evalf(self, prec):
        # (A param fixed at its value makes a number of it, which Max and Min compare.)
        return sympy.Pow(*self.args)._eval_evalf(prec)

    def _mpmathcode(self, printer):
        # The probes' guarded power (probe._ProbePrinter), one factor still.
        return f"_probe_power({printer._print(self.args[0])}, {printer._print(self.args[1])})"


def _powers_as_factors(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with each power of a variable base as an _autograd_power, but inside
    conditions, which are never differentiated."""
    if expr.is_Atom or isinstance(expr, sympy.logic.boolalg.Boolean) or not expr.free_symbols:
        return expr
    args = tuple(_powers_as_factors(a) for a in expr.args)
    if expr.is_Pow and expr.base.free_symbols:
        return _autograd_power(*args)
    return expr.func(*args) if args != expr.args else expr


def _as_autograd_differentiates(formula: sympy.Expr) -> sympy.Expr:
    """``formula`` as printed, with torch.sigmoid (by its output) and powers (a factor of
    their own) differentiating as autograd differentiates them: for _autograd_derivative."""
    printed = _as_printed(formula).replace(sigmoid, _autograd_sigmoid).replace(expm1, _autograd_expm1)
    return _powers_as_factors(printed)


def _autograd_derivative(printed: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr | None:
    """The derivative by ``symbol`` of a formula as autograd computes it from the printed
    code (``printed``: its _as_autograd_differentiates form), operation by operation and
    unsimplified; None where SymPy cannot write it."""
    try:
        derivative = _differentiate(printed, symbol)
    except SymgradError:
        return None
    return derivative.replace(_autograd_sigmoid, sigmoid).replace(_autograd_expm1, expm1)


def _as_printed(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each ExpandedFunction as the Piecewise the code computes, and each
    Taylor series as its polynomial."""
    return expand_functions(expr).replace(lambda node: isinstance(node, TaylorPolynomial), lambda node: node.elementary())


# Outer functions whose derivative underflows where an exponential inside overflows.
_NESTED_OUTER = (sympy.exp, sympy.tanh, sigmoid, softplus)


def autograd_loses_second_derivatives(
    formula: sympy.Expr, raw: sympy.Expr, symbols: tuple[sympy.Symbol, ...], fixed: Mapping[sympy.Symbol, sympy.Expr] | None = None
) -> bool:
    """Whether autograd's derivative of ``formula`` (a create_graph formula of a gradient,
    whose unstabilised form is ``raw``) by some of ``symbols`` is nan or inaccurate where
    the mathematics is finite (finite_where_the_math_is), with the symbols in ``fixed``
    (params) probed at their values there only.

    autograd differentiates what backward computed, and that can lose what the first
    derivative kept: softplus's formula sigmoid(x) has autograd's derivative y*(1 - y), 0 at
    x = 20 in float32 where the exact value is 2.1e-9 (torch's own F.softplus gives 0 too),
    and 1/expm1(x), log(1 - exp(-x))'s, has exp(x)/expm1(x)**2, inf/inf = nan at x = 100
    (found by a double-backward survey). Where SymPy cannot write autograd's derivative,
    False: it stays autograd's; and so it does, unchecked, beyond the simplification bounds
    (_beyond_second_derivative_bounds) and with four symbols or more. True without probing
    for three kinds of formula whose failure the probes cannot see: a function of an
    exponential, a hypot_plus and a difference of squares (below).
    """
    fixed = fixed or {}
    if _beyond_second_derivative_bounds(raw) or len((formula.free_symbols | raw.free_symbols) - set(fixed)) > 3:
        return False  # (four symbols: finite_where_the_math_is does not probe them)
    if any(isinstance(node, _NESTED_OUTER) and node.args[0].has(sympy.exp) for node in sympy.preorder_traversal(formula)):
        # A function of an exponential (TanhExp's tanh(exp(x)), exp(x - 2*exp(x)) in its
        # gradient): autograd's chain rule multiplies the inner exp, inf from x = 89 in
        # float32, by the outer's derivative, 0 there: nan, where the probes' exact reference
        # overflows too and so cannot show it.
        return True
    if formula.has(hypot_plus):
        # autograd's product rule on a quotient of it cancels between points the probe
        # samples: the x-gradient of y*(sqrt(x**2 + 1) - x), -y*r/h with r = hypot_plus(-x,
        # 1), has x-derivative y*(r/h**2 + x*r/h**3), 5e-4 off at x = -50 in float32, while
        # its symbolic form y*r*hypot_plus(x, 1)/h**3 (stable._hypot_sum) is exact.
        return True
    if _has_nested_hypot(_as_printed(formula)):
        # hypot(hypot(x, y), c): autograd's chain rule multiplies the inner hypot's
        # derivative x/hypot(x, y), 0/0 = nan at x = y = 0, by hypot(x, y)/H, and SymPy's
        # derivative cancels the two, so the probe cannot see it: the Hessian of
        # x/sqrt(x**2 + y**2 + 1e-8) was nan at the origin (found by an accuracy hunt).
        return True
    if has_difference_of_squares(formula) or has_offset_quotient(formula):
        # (1 - x)*(1 + x) (stable._difference_of_squares): autograd's product rule computes
        # its derivative as (1 - x) - (1 + x), which cancels near 0, where the probes' points
        # do not reach: asin's second derivative was 0 at x = 1e-8 in float32 (found in review);
        # and x/(1 + x)'s quotient rule cancels at large x, beyond their reach
        return True
    # (fixed first: a param is never differentiated, and as a number it folds)
    printed = _as_autograd_differentiates(formula.xreplace(fixed))
    for symbol in symbols:
        autograd = _autograd_derivative(printed, symbol)
        if autograd is None:
            return False
        if not finite_where_the_math_is(autograd, _differentiate(raw, symbol).xreplace(fixed)):
            return True
    return False


def _has_nested_hypot(expr: sympy.Expr) -> bool:
    """Whether some hypot in ``expr`` has a hypot among its arguments."""
    return any(
        isinstance(node, hypot) and any(isinstance(arg, hypot) for arg in node.args)
        for node in sympy.preorder_traversal(expr)
    )


def exact_second_derivatives(
    raw: sympy.Expr,
    gradient: sympy.Expr,
    symbols: tuple[sympy.Symbol, ...],
    identities: set[str],
    fixed: Mapping[sympy.Symbol, sympy.Expr] | None = None,
) -> tuple[sympy.Expr, ...] | None:
    """The derivatives of ``gradient`` (whose unstabilised form is ``raw``) by each of
    ``symbols``, each the cheapest symbolic form that finite_where_the_math_is accepts (with
    the symbols in ``fixed`` at their values there), for double backward to use where
    autograd's would be wrong (autograd_loses_second_derivatives); None where some
    derivative has no such form, or beyond the same bounds. Adds the identities used to
    ``identities``.
    """
    fixed = fixed or {}
    if _beyond_second_derivative_bounds(raw):
        return None
    row, used_by_row = [], set()
    for symbol in symbols:
        exact = _differentiate(raw, symbol)
        # The derivative of the stable gradient first: symgrad's functions differentiate into
        # stable forms (sigmoid's into sigmoid(u)*sigmoid(-u)), and it costs no simplify (a
        # second each for two symbols). Then the simplified exact derivative.
        candidates = (lambda: _differentiate(gradient, symbol), lambda: cheapest_form(exact))
        if has_difference_of_squares(gradient) or has_offset_quotient(gradient):
            # (The product rule on (1 - x)*(1 + x) is as symbolic as autograd's: atanh's
            # 1/((1 - x)*(1 + x)) differentiates into 1/(1 - x) - 1/(1 + x) over it, which
            # cancels near 0, beyond the probes' reach; simplified, 2*x/(1 - x**2)**2 does not.
            # Likewise -x/(1 + x)'s -1/(1 + x) + x/(1 + x)**2 at large x, and -1/(1 + x)**2.)
            candidates = candidates[::-1]
        for differentiate in candidates:
            used: set[str] = set()
            (candidate,) = _cheaper_forms((stabilize(differentiate()),), used, False)
            if finite_where_the_math_is(candidate.xreplace(fixed), exact.xreplace(fixed)):
                break
        else:
            return None
        used_by_row |= used
        row.append(candidate)
    identities |= used_by_row
    return tuple(row)


def _beyond_second_derivative_bounds(raw: sympy.Expr) -> bool:
    """Whether ``raw`` is beyond the simplification bounds, where double backward keeps
    autograd's derivative unchecked: the probes' mpmath polygamma took 2 minutes over
    acosh(logaddexp(x, digamma(logaddexp(z, x)))), which generated in 4 s without them
    (found by the fuzz campaign)."""
    return op_count(raw) > SIMPLIFY_MAX_OPS or raw.has(sympy.gamma, sympy.loggamma, sympy.polygamma)


def _reusing_shared_work(gradients: list[tuple[sympy.Expr, ...]]) -> list[tuple[sympy.Expr, ...]]:
    """Backward computes all gradients together (one CSE): let them reuse each other's work."""
    context = [g for row in gradients for g in row]
    return [tuple(reuse_shared_work(g, context) for g in row) for row in gradients]


# Accuracy budget for a form that reuses shared work (reuse_shared_work): relative error,
# in float32 rounding, at most this many units in the last place of the exact value, or no
# worse than the form it replaces.
REUSE_MAX_ULPS = 16
# Where the reuse forms are checked: both signs of these magnitudes, in 24-bit (float32)
# arithmetic against 80-bit. A form like 1 - sigmoid(u) fails where u is about 10-100,
# and u may be x scaled down (50*tanh(x/50): x of 500-5000), so the probes run over many
# decades (the fused gradient of 50*tanh(x/50) was 0 from x = 450; found in review).
REUSE_PROBES = (
    0.001, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 80.0,
    150.0, 300.0, 600.0, 1e3, 2e3, 5e3, 1e4, 3e4, 1e5, 1e6, 1e7, 1e8, 1e10, 1e15, 1e20, 1e30,
)


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


def _cheaper_forms(exprs: tuple[sympy.Expr, ...], identities: set[str], fuse: bool) -> tuple[sympy.Expr, ...]:
    """cheaper_fused_form (``fuse``) or cheaper_eager_form of each, adding the names of the
    identities used to ``identities``."""
    cheaper_form = _cheaper_fused_form if fuse else _cheaper_eager_form
    results = []
    for expr in exprs:
        cheaper, used = cheaper_form(expr)
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
    found in review.)
    """
    return _cheaper_fused_form(expr)[0]


def _cheaper_fused_form(expr: sympy.Expr) -> tuple[sympy.Expr, frozenset[str]]:
    """cheaper_fused_form(expr), and the names (IDENTITIES) of the identities it used.

    The sech and sigmoid forms repeat their argument (in the where's condition and both
    branches), so each rewrites only calls whose argument holds no call it rewrites itself:
    nested, the copies would multiply (tanh(tanh(tanh(tanh(x)))) hung with a tanh form now
    withdrawn; found by the fuzz campaign). The outer calls keep their own kernels.
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


# What one eager kernel costs, relative to an arithmetic operation (x*0.5, -x, x**2), for
# the calls whose cost sets a choice of form below. Measured with ATen on this CPU, 1 thread,
# 1e7 float32 values: -x 2.5 ms, sigmoid 4.2, exp 8.4, cosh 13.3, softplus 16.0, tanh 25.5.
# (SymPy's count_ops, op_count, counts every call as one.) Allocations are not counted: with
# glibc's default allocator a new 40 MB buffer costs more than the kernel that fills it.
EAGER_CALL_COST = {"SIGMOID": 1.5, "EXP": 3.0, "COSH": 5.0, "SOFTPLUS": 6.5, "TANH": 9.0}


def eager_cost(expr: sympy.Expr) -> float:
    """:func:`op_count` with each call weighted by :data:`EAGER_CALL_COST` (others count 1)."""
    visual = sympy.count_ops(expr, visual=True)
    return float(visual.xreplace({s: sympy.Float(EAGER_CALL_COST.get(s.name, 1.0)) for s in visual.free_symbols}))


def cheaper_eager_form(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with calls that eager kernels compute more cheaply another way, if accurate.

    Each candidate is kept only if it costs less by :func:`eager_cost`, which weighs the
    slow kernels (cosh, tanh, softplus) by their measured time.

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
    return _cheaper_eager_form(expr)[0]


def _cheaper_eager_form(expr: sympy.Expr) -> tuple[sympy.Expr, frozenset[str]]:
    """cheaper_eager_form(expr), and the names (IDENTITIES) of the identities it used."""
    used = set()
    candidate = _sech_as_sigmoid_pairs(expr)
    if candidate != expr and eager_cost(candidate) < eager_cost(expr):
        expr = candidate
        used.add("sech_sigmoids")
    candidate, softplus_rules = _softplus_identities(expr)
    if softplus_rules and eager_cost(candidate) < eager_cost(expr) and _as_accurate(candidate, expr):
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
    one, found by the fuzz campaign.)
    """
    try:
        condition = u > 0
        # Building the Piecewise of _minus_abs folds a Piecewise inside u into the condition,
        # and SymPy may refuse that comparison only then (found by the fuzz campaign).
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


def _as_accurate(candidate: sympy.Expr, reference: sympy.Expr) -> bool:
    """Whether ``candidate`` (equal to ``reference``) is accurate enough in float32 rounding.

    Checked for one variable at the REUSE_PROBES, in mpmath at 24 bits of precision (float32's
    mantissa) against ``reference`` at 80 bits; expressions of several symbols keep their form.
    """
    symbols = sorted(reference.free_symbols | candidate.free_symbols, key=lambda s: s.name)
    if len(symbols) != 1:
        return False
    try:
        # Real-only, as in sampling_domain: the generated code computes over the reals, and
        # mpmath's complex digamma of log(-20)-like values loops for minutes (found by the
        # fuzz campaign).
        evaluate_candidate, evaluate_reference = (
            real_only(probe_code(symbols, expr))
            for expr in (candidate, reference)
        )
    except (TypeError, ValueError, KeyError):
        return False
    for magnitude in REUSE_PROBES:
        for point in (mpmath.mpf(magnitude), mpmath.mpf(-magnitude)):
            try:
                with mpmath.workprec(80):
                    exact = _as_mpf(evaluate_reference(point))
            except PROBE_FAILURES:
                continue  # outside the function's domain: no constraint here
            if not (isinstance(exact, mpmath.mpf) and mpmath.isfinite(exact)):
                continue
            if exact and not _FLOAT32_TINY <= abs(exact) <= _FLOAT32_MAX:
                # Beyond float32's normal range the value is 0 or inf there whatever the form
                # (mpmath has no underflow: x*tanh(softplus(x)) at -1e15 is -1e-434294481903237).
                continue
            allowed = REUSE_MAX_ULPS * 2.0**-24 * abs(exact)
            try:
                with mpmath.workprec(24):
                    before = _as_mpf(evaluate_reference(point))
                if isinstance(before, mpmath.mpf) and mpmath.isfinite(before):
                    allowed = max(allowed, abs(before - exact))
            except PROBE_FAILURES:
                pass  # the form it replaces fails here in float32 too: allow the 16 ulps
            try:
                with mpmath.workprec(24):
                    got = _as_mpf(evaluate_candidate(point))
            except PROBE_FAILURES:
                return False  # fails (1/0, say) where the mathematics is finite
            if not (isinstance(got, mpmath.mpf) and mpmath.isfinite(got)) or abs(got - exact) > allowed:
                return False
    return True


_FLOAT32_TINY = 2.0**-126  # the smallest normal float32
_FLOAT32_MAX = (2 - 2.0**-23) * 2.0**127


# (bits of precision, largest finite value, smallest subnormal) of float32 and float64.
_FLOAT_FORMATS = ((24, _FLOAT32_MAX, 2.0**-149), (53, FLOAT64_MAX, 2.0**-1074))
# What a function the probe refuses to compute (beyond PROBE_MAX_EXPONENT) is in floating
# point: that far out, it has overflowed or underflowed.
_BEYOND_PROBE = {
    "exp": lambda a: mpmath.inf if a > 0 else mpmath.mpf(0),
    "expm1": lambda a: mpmath.inf if a > 0 else mpmath.mpf(-1),
    "sinh": lambda a: mpmath.inf if a > 0 else -mpmath.inf,
    "cosh": lambda a: mpmath.inf,
    "_probe_power": lambda base, exponent: _float_power(base, exponent),
}


def _float_power(base, exponent):
    """base**exponent as IEEE arithmetic has it, where mpmath refuses or the probe will not
    compute it: inf**-2 is 0 and 0**-1 is inf (torch), not OverflowError or ZeroDivisionError."""
    if base == 0:
        if exponent < 0:
            return mpmath.inf
        return mpmath.mpf(0) if exponent > 0 else mpmath.mpf(1)
    if mpmath.isinf(base):
        return mpmath.power(base, exponent)
    size = exponent * mpmath.log(abs(base))  # (the probe refused it: far beyond any float)
    return (mpmath.inf if size > 0 else mpmath.mpf(0)) * (-1 if base < 0 and exponent % 2 == 1 else 1)


def _in_float_range(evaluate, largest: float, smallest: float):
    """Make every function the probe code calls round its result to a float format's range,
    as torch computes: beyond ``largest`` it is inf, below ``smallest`` 0. mpmath has no
    overflow, so cosh(x)**-3 stays accurate there at any x where float32 has inf (and
    inf*0 and inf/inf, nan, follow from mpmath's own arithmetic on inf). Powers (and so
    quotients) are calls here; sums and products are not rounded, so x**5*y**5*exp(-x) at
    x = y = 1e4, nan in float32, passes."""
    return wrap_probe_calls(
        evaluate, lambda name, function: _rounded_to_range(function, largest, smallest, _BEYOND_PROBE.get(name))
    )


def _rounded_to_range(fn, largest: float, smallest: float, beyond_probe):
    largest, smallest = mpmath.mpf(largest), mpmath.mpf(smallest)  # (see probe._guard)

    def rounded(*args):
        try:
            value = fn(*args)
        except (OverflowError, ZeroDivisionError):
            if beyond_probe is None:
                raise
            return beyond_probe(*args)
        if isinstance(value, mpmath.mpf) and mpmath.isfinite(value):
            if abs(value) > largest:
                return mpmath.inf if value > 0 else -mpmath.inf
            if abs(value) < smallest:
                return mpmath.mpf(0)
        return value

    return rounded


# A second derivative off by more than this in float arithmetic is not rounding, nor the
# cancellation any form has near a zero of it (sigmoid(x*y)'s at x = y = 1e-3 is 5% off in
# float32), but a form that overflows or cancels terms far larger than itself: SiLU's, with
# sinh(x/2) and sigmoid(-x)**1.5 as SymPy simplifies it, was 1.0 at x = 100 in float32
# where the truth is -3.6e-42.
_SECOND_DERIVATIVE_MAX_ERROR = 0.5
# The probes stop where the stability tests' points do, at 1e4: beyond, the user's own
# expression fails in float32 (exp(-x)*log1p(y**2) is 0*inf = nan at x = 300, y = 1e30,
# forward included), so no form of its derivatives could be told from another there.
_SECOND_DERIVATIVE_PROBE_MAX = 1e4
# The probes for two symbols: every pair of REUSE_PROBES would be 1936 points. These keep
# float32's overflows (from 89 for exp and cosh, 179 for cosh(x/2)) and float64's (710, 1420).
_PAIR_PROBES = (0.001, 0.5, 3.0, 20.0, 100.0, 300.0, 3e3, 1e4)
# ... and for three, every triple of these (512 points, against 256 for a pair): products
# of three reach into float32's overflows from 3*3*3 (log(1+exp(x*y*z))'s autograd second
# derivative is 0 there, the exact one 1e-11) and float64's from 30*30*3.
_TRIPLE_PROBES = (0.5, 3.0, 30.0, 1e4)
# A reference value that is finite but cancels beyond the precisions tried (about 2000 bits:
# at x = 700 the terms of SiLU's simplified second derivative are e**350 times larger, which
# 512 bits resolve; 2048 bits cover terms up to float64's range).
_UNRESOLVED = object()


def _as_mpf(value):
    """A probe's value as an mpf where it is a Python number: a Piecewise branch that is a
    constant evaluates to the int 1, and such points were skipped as not real (the untaken
    branch of Piecewise((sqrt(y - 100), x > 0), (y, True))'s derivative by y was never
    probed where x <= 0)."""
    return mpmath.mpf(value) if isinstance(value, (int, float)) else value


def _exact_value(evaluate, point):
    """The value at ``point``, at a precision that two evaluations agree on (to about 40
    bits); _UNRESOLVED where they never agree but are finite; None where it is not a
    finite real."""
    previous = None
    for bits in (64, 128, 512, 2048):
        try:
            with mpmath.workprec(bits):
                value = _as_mpf(evaluate(*point))
        except PROBE_FAILURES:
            return None
        if not (isinstance(value, mpmath.mpf) and mpmath.isfinite(value)):
            return None
        # (Not two zeros short of the last precision: 1 - tanh(x)**2 rounds to 0 at 128 bits
        # where x = 50, and tanh(softplus(x))'s second derivative went unprobed there.)
        if previous is not None and abs(value - previous) <= 2.0**-40 * abs(value) and (value != 0 or bits == 2048):
            return value
        previous = value
    return _UNRESOLVED


def finite_where_the_math_is(candidate: sympy.Expr, reference: sympy.Expr) -> bool:
    """Whether ``candidate`` (equal to ``reference``) computes a value that is not nan, and
    not far off the exact one where finite, in float32 and float64 arithmetic wherever that
    exact value is finite and in the format's range: no inf/inf, inf*0 or cancellation of
    overflowing terms.

    Checked at both signs of the REUSE_PROBES up to _SECOND_DERIVATIVE_PROBE_MAX (of
    _PAIR_PROBES, every pair, for two symbols; of _TRIPLE_PROBES, every triple, for three
    within SIMPLIFY_MAX_OPS operations),
    each rounded to float32 (so the same point in both formats: x - y is 0 at x = y in
    either), against ``reference`` evaluated exactly (_exact_value), where the reference's
    own terms stay within float64's range (_exact_values); where it cancels beyond the
    precisions tried, the value need only not be nan. Other expressions are not checked
    (True).
    """
    symbols = tuple(sorted(reference.free_symbols | candidate.free_symbols, key=lambda s: s.name))
    if not 1 <= len(symbols) <= 3:
        return True
    if len(symbols) == 3 and op_count(reference) > SIMPLIFY_MAX_OPS:
        # (512 points of a large expression cost seconds: the 40-term, 3-input expression's
        # --save speed second derivatives took 10 s more to probe. Unchecked, as before.)
        return True
    # As printed: a Removable is a torch.where of its series and its closed form, which mpmath
    # would otherwise evaluate exactly (at 30 more digits) and so never see overflow.
    candidate = _as_printed(candidate)
    try:
        exact_values = _exact_values(reference, symbols)
        in_formats = [_in_float_range(probe_code(symbols, candidate), largest, smallest) for _, largest, smallest in _FLOAT_FORMATS]
    except (TypeError, ValueError, KeyError):
        return True  # not printable for mpmath: left to the stability tests, as before
    for point, exact in exact_values:
        for (bits, largest, smallest), evaluate in zip(_FLOAT_FORMATS, in_formats):
            if exact is not _UNRESOLVED and abs(exact) > largest:
                continue
            try:
                with mpmath.workprec(bits):
                    got = _as_mpf(evaluate(*point))
            except PROBE_FAILURES:
                return False
            if not isinstance(got, mpmath.mpf) or mpmath.isnan(got):
                return False
            if mpmath.isinf(got) or exact is _UNRESOLVED:
                # inf where the exact value is finite is an intermediate overflowing first, which
                # some products cannot avoid: exp(-x)*log1p(y**2) at x = -100, y = 1e-3 in float32.
                continue
            # Near the subnormal range an absolute error of the smallest normal number is
            # rounding (2**-126 in float32: the smallest subnormal times 2**23).
            if abs(got - exact) > max(_SECOND_DERIVATIVE_MAX_ERROR * abs(exact), smallest * 2.0 ** (bits - 1)):
                return False
    return True


@functools.lru_cache(maxsize=64)
def _exact_values(reference: sympy.Expr, symbols: tuple[sympy.Symbol, ...]) -> tuple:
    """(point, exact value) at each probe point where the value is finite and not 0: for
    finite_where_the_math_is, which checks up to two forms of each derivative against one
    reference. (At an exact zero of a factor, any form is 0*inf = nan once another factor
    overflows: (1 - y**2)*exp(-x) at y = 1, x = -100 in float32.)

    Real-only, and without intermediates beyond float64 (real_only): where the reference
    has one (exp(1e3) in sigmoid's second derivative at x = -1e3), the point is skipped, so
    float64's own overflows go unprobed. Allowed further, x**y at x = y = 1e4, 1e40000, went
    into sigmoid's mpmath exp, which took minutes (found by the fuzz campaign).
    """
    evaluate = real_only(probe_code(symbols, reference))
    magnitudes = ([m for m in REUSE_PROBES if m <= _SECOND_DERIVATIVE_PROBE_MAX], _PAIR_PROBES, _TRIPLE_PROBES)[len(symbols) - 1]
    # Rounded to float32, and so exact in float64 too.
    rounded = [mpmath.mpf(struct.unpack("f", struct.pack("f", m))[0]) for m in magnitudes]
    signed = [m * sign for m in rounded for sign in (1, -1)]
    values = []
    for point in itertools.product(signed, repeat=len(symbols)):
        exact = _exact_value(evaluate, point)
        if exact is not None and exact != 0:  # (None: outside the domain, or beyond the probe)
            values.append((point, exact))
    return tuple(values)


# A derivative this cheap (by op_count) is recomputed in backward even under --save speed:
# computing it in forward as well would save one tensor more and no time.
SPEED_MIN_OPS = 2


# Work below this is cheap enough that a fused kernel recomputes it for free: sharing it is
# no reason to write a derivative out and read it back (sqrt(x) and 1/x in sqrt(x) + 1/x).
_CHEAP_FUNCTIONS = (sympy.Abs, sympy.sign, sympy.Heaviside, sympy.Piecewise, sympy.floor, sympy.ceiling)


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
                # 1.0**y): forward could not return it as a tensor (found by the fuzz campaign).
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
                # One ATen kernel computes it in backward (symgrad.kernels): faster than
                # computing it in forward and multiplying, and nothing more is saved.
                continue
            row = _returned_derivative_row(derivation.raw_gradients[i][j], gradient, parsed, identities)
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
        row = _returned_derivative_row(raw, gradient, parsed, identities)
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


def _returned_derivative_row(raw: sympy.Expr, gradient: sympy.Expr, parsed: Parsed, identities: set[str]):
    """The second derivatives of a gradient forward would return (_second_derivatives),
    adding the identities used to ``identities``; None where backward recomputes it
    instead."""
    row_identities: set[str] = set()
    try:
        row = _second_derivatives(raw, gradient, parsed.inputs, parsed.spec.fuse, row_identities)
    except SymgradError:
        return None  # SymPy cannot differentiate it again: backward recomputes this one
    if any(g.has(sympy.AccumBounds) for g in row):
        # An interval where a value should be (see _refuse_interval_values): backward
        # recomputes this one, and autograd differentiates that (found in review).
        return None
    if all(g == 0 for g in row):
        # Piecewise constant (3*sign(x)): cheap to recompute, and it may even fold to a
        # number while printing, which forward could not return as a tensor (found by
        # the fuzz campaign).
        return None
    identities |= row_identities
    return row


def _second_derivatives(
    raw: sympy.Expr, gradient: sympy.Expr, inputs: tuple[sympy.Symbol, ...], fuse: bool, identities: set[str]
) -> tuple[sympy.Expr, ...]:
    """The derivatives of ``gradient`` (whose unstabilised form is ``raw``) by each input, as
    double backward computes them, adding the identities used to ``identities``.

    First the simplified derivative of ``raw``, which is usually shortest; if
    finite_where_the_math_is refuses it, the derivative of the stable form forward computes,
    where SymPy's simplification had made it unstable again: SiLU's became sinh(x/2) times
    powers of 1.5 of sigmoids, inf*0 from x = 179 in float32 (found by a double-backward
    survey). If both fail, the first stays, as before the check: often the user's expression
    overflows there whatever the form (x**y*sigmoid(-x**y) at x = 1e-3, y = -20 in float32,
    inf*0; found by the fuzz campaign), and not returning the derivative would cost its
    speed for nothing. (Not always: the two-input softmax exp(a)/(exp(a) + exp(b) + 1) keeps
    rows that are nan at large |a|, |b| in float32, where autograd's derivative of the
    recomputed gradient is finite; README, "Numerical stability".)
    """
    exact = [_differentiate(raw, s) for s in inputs]
    first = None
    for differentiate in (
        lambda s, e: cheapest_form(e),
        lambda s, e: _differentiate(gradient, s),
    ):
        used: set[str] = set()
        row = tuple(stabilize(differentiate(s, e)) for s, e in zip(inputs, exact))
        row = _cheaper_forms(row, used, fuse)
        if all(finite_where_the_math_is(g, e) for g, e in zip(row, exact)):
            break
        first = first or (row, used)
    else:
        row, used = first
    identities |= used
    return row


def _terms_reaching(derivation: Derivation, j: int) -> list[tuple[sympy.Expr, str | None]]:
    """(derivative, reduction) of each differentiable output whose gradient reaches input j."""
    return [
        (row[j], output.reduction)
        for row, output, constant in zip(derivation.gradients, derivation.parsed.outputs, derivation.nondifferentiable)
        if not constant and row[j] != 0
    ]


class _MergingPiecewise(sympy.Piecewise):
    """A Piecewise that differentiates into successive distinct branches.

    SymPy's own derivative rebuilds the Piecewise, and its fold joins successive branches
    whose derivatives are equal (often all 0) with ``distribute_and_over_or``, which is
    exponential in the conditions: 90 s per input on a 3-input expression in fuzz campaign
    35. Joining them first with a plain Or leaves SymPy nothing to distribute.
    """

    def _eval_derivative(self, symbol: sympy.Symbol) -> sympy.Expr:
        pairs: list[tuple[sympy.Expr, sympy.logic.boolalg.Boolean]] = []
        for value, condition in self.args:
            derivative = sympy.diff(value, symbol)
            if pairs and pairs[-1][0] == derivative:
                pairs[-1] = (derivative, sympy.Or(pairs[-1][1], condition))
            else:
                pairs.append((derivative, condition))
        return pairs[0][0] if len(pairs) == 1 else self.func(*pairs)


def _diff(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    """sympy.diff, with every Piecewise differentiated as a _MergingPiecewise."""
    if not expr.has(sympy.Piecewise):
        return sympy.diff(expr, symbol)
    merging = expr.replace(
        lambda e: type(e) is sympy.Piecewise, lambda e: _MergingPiecewise(*e.args, evaluate=False)
    )
    derivative = sympy.diff(merging, symbol)
    return derivative.replace(lambda e: isinstance(e, _MergingPiecewise), lambda e: sympy.Piecewise(*e.args))


def _differentiate(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    try:
        derivative = _diff(expr, symbol)
        # Dirac deltas (from sign, Heaviside, Max, ...) and the derivatives of floor/ceiling are
        # zero almost everywhere, which is the gradient autograd uses for these functions.
        derivative = derivative.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.Integer(0))
        derivative = derivative.replace(
            # (sign of an argument SymPy cannot prove real stays an unevaluated Derivative)
            lambda e: isinstance(e, sympy.Derivative)
            and isinstance(e.expr, (sympy.floor, sympy.ceiling, sympy.sign, sympy.Heaviside)),
            lambda e: sympy.Integer(0),
        )
        # Abs and sign of a function that SymPy cannot prove real (acosh, log, ...) differentiate
        # into re() and im(). The generated code runs over the reals and the sampling domain
        # refuses complex intermediates, so there re(u) is u and im(u) is 0; substituting them
        # lets SymPy fold cosh(0) and sinh(0) (found by the fuzz campaign: cosh(0) was printed).
        derivative = derivative.replace(lambda e: isinstance(e, sympy.re), lambda e: e.args[0])
        derivative = derivative.replace(lambda e: isinstance(e, sympy.im), lambda e: sympy.Integer(0))
        derivative = _absolute_values(derivative)
    except (TypeError, ValueError) as exc:
        # e.g. floor(log(floor(log(x, 2)), 2)): rebuilding the derivative, SymPy subtracts two
        # relationals (found by the fuzz campaign)
        raise SymgradError(f"SymPy cannot differentiate {_shown(expr)} by {symbol}: {exc}") from None
    if derivative.has(sympy.Derivative, sympy.Subs):
        raise SymgradError(f"SymPy cannot differentiate {_shown(expr)} by {symbol}")
    if derivative.has(*_UNDEFINED):
        raise SymgradError(f"the derivative of {_shown(expr)} by {symbol} is complex or undefined: {_shown(derivative)}")
    return derivative


def _sign_factor(product: sympy.Expr) -> sympy.Expr | None:
    """A factor sign(u) of ``product`` whose argument u is a factor too, or None."""
    if not product.is_Mul:
        return None
    return next((f for f in product.args if isinstance(f, sympy.sign) and f.args[0] in product.args), None)


def _absolute_values(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each product u*sign(u) written as Abs(u), which it is for real u (0 at 0).

    SymPy differentiates Abs(x) into sign(x) and leaves x*sign(x) as it is, so simplify could
    not see that softsign's derivative 1/(|x| + 1) - x*sign(x)/(|x| + 1)**2 is 1/(|x| + 1)**2;
    computed as written it cancels, 3x less accurate than F.softsign's at |x| = 1e4 in
    float32 (found by an accuracy hunt).
    """

    def absolute(product: sympy.Expr) -> sympy.Expr:
        sign = _sign_factor(product)
        rest = list(product.args)
        rest.remove(sign)
        rest.remove(sign.args[0])
        return sympy.Mul(*rest, sympy.Abs(sign.args[0]))

    return expr.replace(lambda e: _sign_factor(e) is not None, absolute)


# What a real, finite derivative cannot hold.
_UNDEFINED = (sympy.I, sympy.zoo, sympy.nan, sympy.AccumBounds)


def _shown(expr: sympy.Expr) -> str:
    """``str(expr)`` for a message; SymPy cannot order a sum holding nan to print it (found by
    the fuzz campaign), and then the message says so instead of crashing."""
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
        # generated code could not even print it (both found by the fuzz campaign).
        candidates = [c for c in candidates if not c.has(*_UNDEFINED)]
    # Ties go to the earliest candidate, so the choice is deterministic.
    return min(candidates, key=op_count)


def _simplified(expr: sympy.Expr) -> sympy.Expr:
    """``simplify``, or ``expr`` itself where SymPy fails on it: simplification is optional.

    (SymPy raises, e.g. "The argument 'exp(-1)*_rf(1, E)' is not comparable." from Max
    inside simplify, a RecursionError on nested Piecewise, or a KeyError from logcombine on
    a log of zoo/x**2; found by the fuzz campaign.)
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
    10-op -128*sinh(8*x + 16)/cosh(8*x + 16)**3 (found by the fuzz campaign). Over a symbol
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
        # algebraic extensions for minutes ((acosh(x) - x + 1)**(cosh(x) - atan(x)); found
        # by the fuzz campaign): the trig calls themselves become symbols.
        def abstract(e: sympy.Expr) -> sympy.Expr:
            return e.replace(lambda n: isinstance(n, _TRIG), symbol_for)
    else:
        def abstract(e: sympy.Expr) -> sympy.Expr:
            return e.replace(
                lambda n: isinstance(n, _TRIG) and not n.args[0].is_Atom, lambda n: n.func(symbol_for(n.args[0]))
            )
    # Until nothing changes: replacing cosh(x) inside sinh(y - cosh(x)) rebuilds it as
    # -sinh(_arg - y), a new node the same pass does not visit, and trigsimp then ran for
    # 100 s on one speed-mode second derivative (found by fuzz campaign 37).
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
    # for minutes; found by the fuzz campaign)
    radicals = any(not p.exp.is_Integer for p in expr.atoms(sympy.Pow))
    # (and trig inside trig: the speed-mode second derivative of sinh((x + 1)*sinh(x)) ran
    # for minutes in polynomial division; found by the fuzz campaign)
    nested = any(isinstance(node, _TRIG) and node.args[0].has(*_TRIG) for node in sympy.preorder_traversal(expr))
    # (and trig in a sum raised to a power: trigsimp ran for minutes on the second derivative
    # of (tanh(x) - x**-2)**-2, with (tanh(x) - 1/x**2)**-3 and **-4 in it; found by fuzz
    # campaign 4134)
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
        # polygamma(1, cosh(2*x)) (found by the fuzz campaign)
        return False
    if _piecewise_branches(expr) > SIMPLIFY_MAX_BRANCHES:
        return False
    conditions = [c for node in sympy.preorder_traversal(expr) if isinstance(node, sympy.Piecewise) for _, c in node.args]
    if any(c.has(sympy.ITE, sympy.Piecewise, sympy.Max, sympy.Min) for c in conditions):
        # A branch condition that compares with a bool (2*x < (x <= 2.5) is an ITE) or a
        # Piecewise: piecewise_simplify's interval search ran for minutes (found by the fuzz
        # campaign).
        return False
    if any(_nested_call(c) for c in conditions):
        # piecewise_simplify solves each condition for its symbol: log(log(x, 10), 10) > 10
        # inverts to x > 10**(10**10), and evaluating that ran for minutes (found by fuzz
        # campaign 4103).
        return False
    if _condition_comparisons(expr) > SIMPLIFY_MAX_COMPARISONS:
        # simplify's logic minimisation on a condition of 17 comparisons (a Piecewise inside
        # another's condition, expanded) ran for over 10 minutes (found by fuzz campaign 37)
        return False
    if _condition_comparisons(expr, disjunctive=True) > SIMPLIFY_MAX_COMPARISONS:
        # ... and on 8 that a negated conjunction spreads out: (a & ~(b & c & d)) | (b & c & d &
        # e) is 4 conjunctions of 10 comparisons, and took 42 s on its own (found by fuzz
        # campaign 4135). Bounded: 8 comparisons spread into at most 18 conjunctions (3*3*2).
        return False
    if any(abs(r.q) > SIMPLIFY_MAX_DENOMINATOR for r in expr.atoms(sympy.Rational)):
        return False
    powers = [p for p in expr.atoms(sympy.Pow) if p.exp.is_Rational]
    if any(abs(p.exp) > SIMPLIFY_MAX_DEGREE for p in powers):
        return False
    powers_of_sums = (abs(p.exp) for p in powers if p.base.is_Add)
    return sum(powers_of_sums) <= SIMPLIFY_MAX_POWER


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
    try:
        evaluate = real_only(
            probe_code(symbols, exprs)
        )
    except (TypeError, ValueError, KeyError, NotImplementedError) as exc:
        # SymPy folds Piecewise while printing and can meet an undefined branch, e.g.
        # Max(log(z >= 2.5), x) has log(0) = zoo where z < 2.5 (found by the fuzz campaign);
        # a value no printer knows (PrintMethodNotImplementedError) is a NotImplementedError.
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise SymgradError(
            f"the function cannot be evaluated numerically ({type(exc).__name__}: {reason}); is it undefined"
            " somewhere, like log of a 0/1 comparison?"
        ) from None
    chosen, failed = _coordinate_search(evaluate, symbols, given, DOMAIN_CANDIDATES[0])
    if failed is not None and len(symbols) > 1:
        # Each symbol was tried with the others on their first candidate, where another may be
        # undefined for every choice of the first: gamma(x) + loggamma(y) has gamma's poles on
        # (-3, 3) whatever y's interval, and loggamma's whatever x's (a user hunt). Start again
        # from the first candidate on which all of them are fine at once.
        for candidate in DOMAIN_CANDIDATES[1:]:
            if _all_moderate(evaluate, [given.get(s.name, candidate) for s in symbols]):
                chosen, failed = _coordinate_search(evaluate, symbols, given, candidate)
                break
    if failed is not None:
        raise SymgradError(
            f"could not find an interval where the function and its gradients are finite and at most"
            f" {DOMAIN_MAX_ABS:g} in size for {failed.name!r}; give one with --domain {failed.name}=LOW:HIGH"
        )
    if not _all_moderate(evaluate, [chosen[s] for s in symbols]):
        raise SymgradError(
            f"could not find sampling intervals where the function and its gradients are finite and at most"
            f" {DOMAIN_MAX_ABS:g} in size;"
            " give them with --domain NAME=LOW:HIGH"
        )
    return tuple((s, *chosen[s]) for s in symbols)


def _coordinate_search(evaluate, symbols, given: dict, start: tuple[float, float]):
    """Intervals for ``symbols`` (``given`` ones fixed, the others from ``start``), each the
    first candidate on which the whole box is moderate with the others' current choices, in
    two passes; and the symbol for which no candidate was, or None."""
    chosen = {s: given.get(s.name, start) for s in symbols}
    passes = 2  # a second pass lets each symbol adapt to the others' choices
    for attempt in range(passes):
        for symbol in symbols:
            if symbol.name in given:
                continue
            for candidate in DOMAIN_CANDIDATES:
                trial = {**chosen, symbol: candidate}
                if _all_moderate(evaluate, [trial[s] for s in symbols]):
                    chosen[symbol] = candidate
                    break
            else:
                if attempt == passes - 1 or len(symbols) == 1:
                    return chosen, symbol
                # else: another symbol's interval may be what is wrong (x*log(y) fails for every
                # x while y is still on (-3, 3)); the next pass tries again.
    return chosen, None


def _probe_points(intervals: list[tuple[float, float]]):
    """The probe points in a box, each with the largest size allowed there: a Kronecker
    sequence (deterministic, well spread, and free of the round numbers (0, 1) where many
    singularities sit and through which no real sample would pass), sizes up to
    DOMAIN_MAX_ABS; then the corners, 1% inside, which need only be real and finite. A
    function can fail in one corner only: log(z + 1 - tanh(z) + tanh(y)) is NaN for z
    near -3 whatever y, and no interior probe came that close while gradcheck's samples did
    (found by fuzz campaign 37). (A sum of 40 cubic terms is over 1000 in a corner of
    (-3, 3)**3, and fine to sample.)"""
    steps = [math.sqrt(p) % 1 for p in (2, 3, 5, 7, 11, 13, 17, 19)]
    for k in range(1, DOMAIN_PROBES * len(intervals) + 1):
        point = [lo + (hi - lo) * ((k * steps[i % len(steps)] + 0.5 * i) % 1) for i, (lo, hi) in enumerate(intervals)]
        yield point, DOMAIN_MAX_ABS
    if len(intervals) <= DOMAIN_CORNER_MAX_INPUTS:
        for corner in itertools.product((0.01, 0.99), repeat=len(intervals)):
            yield [lo + (hi - lo) * f for f, (lo, hi) in zip(corner, intervals)], math.inf


# Boxes of more inputs skip the corner probes (2**n of them).
DOMAIN_CORNER_MAX_INPUTS = 6


def _all_moderate(evaluate, intervals: list[tuple[float, float]]) -> bool:
    for point, largest in _probe_points(intervals):
        try:
            values = evaluate(*point)
        except PROBE_FAILURES:
            return False
        if not all(moderate(value, largest) for value in values):
            return False
    return True
