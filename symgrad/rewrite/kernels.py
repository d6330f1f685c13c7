"""ATen's fused kernels: backward kernels for a first-order backward in eager bodies, and
activation kernels for eager forward bodies (FORWARD_KERNELS, at the end).

Eager autograd runs one fused kernel per op's backward (``silu_backward`` reads the
upstream gradient and x once, and writes once), where a symbolic backward runs each
operation of its formula as a kernel of its own: SiLU's exact gradient took six passes
over memory. These kernels cannot serve double backward: ``silu_backward`` and
``mish_backward`` have no derivative in torch, and ``softplus_backward``'s differentiates
through ``1 - s`` of a rounded sigmoid (0 where the true value is 4e-8). So a generated
backward calls them only while autograd is not recording (the usual
``create_graph=False``), and keeps the formula, which double backward differentiates
exactly, under ``create_graph=True``.

A kernel is used only where the gradient is exactly its derivative (checked at several
points in 50-digit arithmetic), and only kernels measured as accurate as the formula they
replace, in every floating dtype (tests/test_stability.py holds the generated modules to
mpmath): each computes in float32 for float16 and bfloat16 on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from ..codegen.syntax import Code, call, method, name
from ..math.functions import log_sigmoid, mish, sigmoid, silu, softplus


# Points at which a gradient and a kernel's derivative must agree, one value per symbol
# (fixed, so that generation is deterministic; irrational-looking so that no identity
# holds there by accident).

_PROBES = (0.3719, -1.2041, 2.3307, -0.4391, 1.7713)
_PROBE_DIGITS = 50
_AGREEMENT = sympy.Float(10) ** -40
_SIZE_FACTOR = 4


@dataclass(frozen=True)
class Kernel:
    """One ATen backward kernel: the function whose derivative it computes (of an argument
    ``u``), that derivative, and the call, built from the code of the upstream gradient and
    of ``u`` (syntax trees)."""

    function: str
    derivative: Callable[[sympy.Expr], sympy.Expr]
    call: Callable[[Code, Code], Code]


def _softplus_backward(grad: Code, u: Code, beta: float) -> Code:
    """ATen's softplus_backward at our softplus threshold, 40 (printer.PRINTERS)."""
    return call("torch.ops.aten.softplus_backward", grad, u, beta, 40.0)


# Each computes the upstream gradient times the derivative in fewer passes over memory
# (measured on this CPU, 1 thread, 1e7 float32 values, upstream gradient included:
# softplus_backward 5.6 ms against 9.4 for the formula's sigmoid and product, silu_backward
# 5.4 against 20-30).

KERNELS = (
    # d/du softplus(u) = sigmoid(u): g*z/(z + 1) with z = exp(u), and g itself above the
    # threshold, where sigmoid(u) is 1 in float64 already (1 - 4e-18 at 40).
    Kernel("softplus", sigmoid, lambda grad, u: _softplus_backward(grad, u, 1.0)),
    # d/du u*sigmoid(u) = s*(1 + u*(1 - s)): the formula symgrad prints, in one kernel.
    Kernel("silu", lambda u: silu(u).fdiff(), lambda grad, u: call("torch.ops.aten.silu_backward", grad, u)),
    # d/du sigmoid(u) = sigmoid(u)*sigmoid(-u) = s*(1 - s) with s = sigmoid(-|u|) <= 1/2,
    # where 1 - s does not cancel: sigmoid_backward of that s, computed in place in the
    # fresh tensor abs() returns. (sigmoid_backward of the output y = sigmoid(u) is 0 in
    # float32 from u = 17, where the truth is 4e-8.) Round-robin, 1 thread, on an AMD EPYC:
    # 0.44 ms at 1e6 against 0.56 for two softplus_backward (g*sigmoid(u), then times
    # sigmoid(-u)); at 1e7 7.7 against 7.3 with the benchmark's allocator settings, 36.5
    # against 40.3 with glibc's defaults; out of place, 0.52 and 67.0. Where sigmoid(-|u|)
    # is subnormal (|u| > 87 in float32) it is 0: below the smallest normal.
    Kernel(
        "sigmoid",
        lambda u: sigmoid(u) * sigmoid(-u),
        lambda grad, u: call(
            "torch.ops.aten.sigmoid_backward", grad, method(method(method(u, "abs"), "neg_"), "sigmoid_")
        ),
    ),
    # d/du tanh(u) = 1/cosh(u)**2 = 4*sigmoid(2u)*sigmoid(-2u), likewise with beta = 2 and
    # -2, and a scaling in place (13.4 ms against 17.1 for sigmoid_backward of
    # sigmoid(-2|u|), and 21.7 for cosh and a power). (tanh_backward takes tanh(u), whose
    # 1 - y**2 is 0 in float32 from |u| = 9, where the truth is 6e-8.)
    Kernel(
        "tanh",
        lambda u: sympy.cosh(u) ** -2,
        lambda grad, u: method(_softplus_backward(_softplus_backward(grad, u, 2.0), u, -2.0), "mul_", 4),
    ),
    # d/du u*tanh(softplus(u)): mish_backward computes tanh(sp) + u*s*(1 - tanh(sp)**2) with
    # sp = log1p(exp(u)) and s = sigmoid(u), as symgrad's formula does, where the formula
    # runs fifteen kernels (from one sigmoid: derive's cheaper eager form). (Its four
    # transcendental functions were slower than --save speed's derivative computed in forward
    # next to the output, 71.1 ms at 1e7 against 59.7, while forward computed Mish from a
    # sigmoid: the derivative shared it. Forward is F.mish now (FORWARD_KERNELS), which
    # shares nothing, so --save speed leaves the derivative to this kernel too.)
    Kernel(
        "mish",
        lambda u: mish(u).fdiff(),
        lambda grad, u: call("torch.ops.aten.mish_backward", grad, u),
    ),
)


@dataclass(frozen=True)
class KernelCall:
    """A gradient as a kernel's derivative at ``argument``."""

    kernel: Kernel
    argument: sympy.Expr

    def code(self, grad: str, print_expr: Callable[[sympy.Expr], Code]) -> Code:
        return self.kernel.call(name(grad), print_expr(self.argument))


def whole_gradient_kernel(
    spec, inputs: tuple[sympy.Symbol, ...], params: tuple[sympy.Symbol, ...], terms: list[tuple[sympy.Expr, str | None]]
) -> KernelCall | None:
    """The kernel that computes an input's whole gradient, given its ``terms``: (derivative,
    output reduction) for each output that reaches it; else None.

    Only in eager, elementwise, single-input bodies: fused bodies are one kernel anyway, an
    in-place Function's saved tensors are its results, and a reduction's or a broadcast's
    gradient, or a sum over several outputs, is not the kernel's alone.
    """
    if spec.fuse or spec.inplace or len(inputs) != 1 or params or len(terms) != 1:
        return None
    derivative, reduction = terms[0]
    if reduction is not None:
        return None
    return first_order_kernel(derivative, set(inputs))


def first_order_kernel(derivative: sympy.Expr, symbols: set[sympy.Symbol]) -> KernelCall | None:
    """The kernel whose derivative, at an argument in ``symbols`` only, is ``derivative``;
    else None.

    Only for a derivative built from analytic functions: two analytic expressions that
    agree at the probe points are equal, but a Piecewise, Min or clamp can agree there and
    differ beyond a breakpoint (Min(x*sigmoid(x), 3) matched SiLU's kernel, and its
    gradient above 3 was SiLU's, not 0). Nor with a number factor: then
    the kernel, its scaled argument and the product cost as much as the formula
    (2*sigmoid(2*x): 64.1 against 62.9 ms at 1e7).
    """
    if derivative.as_coeff_Mul()[0] != 1 or not _analytic(derivative):
        return None
    arguments = sorted(
        {
            node.args[0]
            for node in sympy.preorder_traversal(derivative)
            if isinstance(node, (sigmoid, sympy.cosh, sympy.tanh))
        },
        # sigmoid(x)*sigmoid(-x) is the derivative at x and at -x: x, the simpler, first.
        key=lambda u: (u.could_extract_minus_sign(), sympy.default_sort_key(u)),
    )
    size = sympy.count_ops(derivative)
    for u in arguments:
        if not u.free_symbols or not u.free_symbols <= symbols:
            continue
        for kernel in KERNELS:
            candidate = kernel.derivative(u)
            # (Only forms of about the derivative's own size are evaluated: a gradient many
            # times larger is not this derivative in any form simplify leaves, and mpmath
            # need not evaluate it.)
            if size <= _SIZE_FACTOR * sympy.count_ops(candidate) and _equal(derivative, candidate):
                return KernelCall(kernel, u)
    return None


# Analytic wherever they are defined: what first_order_kernel's derivatives may hold.

_ANALYTIC = (
    sympy.exp,
    sympy.log,
    sympy.sin,
    sympy.cos,
    sympy.sinh,
    sympy.cosh,
    sympy.tanh,
    sympy.atan,
    sympy.erf,
    sympy.erfc,
    expm1,
    log1p,
    sigmoid,
    softplus,
)


def _analytic(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is built from numbers, symbols, sums, products, powers with number
    exponents and _ANALYTIC functions only."""
    for node in sympy.preorder_traversal(expr):
        if node.is_Symbol or node.is_Number or node.is_NumberSymbol or node.is_Add or node.is_Mul:
            continue
        if node.is_Pow and node.exp.is_number:
            continue
        if isinstance(node, _ANALYTIC):
            continue
        return False
    return True


def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether ``a`` and ``b`` agree at every probe point, to 40 digits."""
    if a == b:
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=sympy.default_sort_key)
    for shift in range(len(_PROBES)):
        point = {s: sympy.Float(_PROBES[(shift + k) % len(_PROBES)], _PROBE_DIGITS) for k, s in enumerate(symbols)}
        try:
            left = sympy.N(a.xreplace(point), _PROBE_DIGITS)
            right = sympy.N(b.xreplace(point), _PROBE_DIGITS)
            if not all(value.is_real and value.is_finite for value in (left, right)):
                return False  # complex, undefined or not a number
            if abs(left - right) > _AGREEMENT * (abs(left) + abs(right)):
                return False
        except (TypeError, ValueError, ArithmeticError, MemoryError, RecursionError):
            return False
    return True


@dataclass(frozen=True)
class ForwardKernelRule:
    """One ATen activation kernel for forward bodies: the SymPy function printed as its
    call (functions.ForwardKernel), the transcendental call its formula makes, of an
    argument ``u``, and how to find ``u`` from a node that may be that call."""

    function: type
    formula: Callable[[sympy.Expr], sympy.Expr]
    inner: Callable[[sympy.Expr], sympy.Expr]
    argument: Callable[[sympy.Basic], sympy.Expr | None]


# One kernel reads u once and writes once, where the formula runs each of its operations
# as a kernel of its own over the whole tensor (measured on the benchmark host, 1 thread,
# 1e7 float32 values, glibc keeping freed memory: F.mish 46 ms against 91 for Mish's
# sigmoid form with its temporaries reused, F.silu 15 against 31 for x*sigmoid(x),
# F.logsigmoid 24 against 43 for -softplus(-x)). Each is as accurate as the formula or
# more, in float32 and float64 at |u| up to 1e30 (mpmath, 50 digits): Mish's sigmoid form
# was 0 for u in (-103.9, -88.7) in float32, where torch.sigmoid underflows and F.mish
# keeps the subnormal exp(u); F.silu and x*sigmoid(x) are both 0 there; F.logsigmoid is
# min(u, 0) - log1p(exp(-|u|)). Fused bodies keep the formula: inductor compiles it into
# its one kernel anyway.

FORWARD_KERNELS = (
    ForwardKernelRule(
        mish,
        lambda u: u * sympy.tanh(softplus(u)),
        lambda u: softplus(u),
        lambda node: node.args[0].args[0] if isinstance(node, sympy.tanh) and isinstance(node.args[0], softplus) else None,
    ),
    ForwardKernelRule(silu, lambda u: u * sigmoid(u), sigmoid, lambda node: node.args[0] if isinstance(node, sigmoid) else None),
    ForwardKernelRule(
        log_sigmoid,
        lambda u: -softplus(-u),
        lambda u: softplus(-u),
        lambda node: -node.args[0] if isinstance(node, softplus) else None,
    ),
)


def with_forward_kernels(expr: sympy.Expr, others: tuple[sympy.Expr, ...] = ()) -> tuple[sympy.Expr, frozenset[str]]:
    """``expr`` with each FORWARD_KERNELS formula as the kernel's function, and the names of
    the functions used; ``others``: the other outputs forward computes with it.

    A formula is replaced only where its transcendental call is then gone from ``expr`` and
    ``others`` (x*sigmoid(x) + sigmoid(x), or a second output sigmoid(x), keeps its one
    sigmoid and a product, cheaper than the sigmoid and a silu) and the
    expression has fewer operations (-softplus(-x) becomes log_sigmoid(x), softplus(-x)
    stays). ``subs`` finds a formula inside a product or a power too: x**2*sigmoid(x) is
    x*silu(x).
    """
    used = set()
    for kernel in FORWARD_KERNELS:
        arguments = {kernel.argument(node) for node in sympy.preorder_traversal(expr)} - {None}
        for u in sorted(arguments, key=sympy.default_sort_key):
            candidate = expr.subs(kernel.formula(u), kernel.function(u))
            if any(e.has(kernel.inner(u)) for e in (candidate, *others)):
                continue
            if sympy.count_ops(candidate) >= sympy.count_ops(expr):
                continue
            expr = candidate
            used.add(kernel.function.__name__)
    return expr, frozenset(used)
