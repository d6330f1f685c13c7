"""symgrad.rewrite.kernels: which gradients an ATen backward kernel computes, and the generated
branch that calls it only while autograd does not record."""

from __future__ import annotations

import mpmath
import pytest
import sympy
import torch

from symgrad.api import generate_source
from symgrad.math import functions as sf
from symgrad.codegen import syntax
from symgrad.rewrite.kernels import FORWARD_KERNELS, KERNELS, first_order_kernel, with_forward_kernels

X, Y = sympy.symbols("x y", real=True)
S = sf.sigmoid


def names(found):
    return None if found is None else (found.kernel.function, found.argument)


@pytest.mark.parametrize(
    "derivative, expected",
    [
        (S(X), ("softplus", X)),
        ((X * (1 - S(X)) + 1) * S(X), ("silu", X)),  # as derive writes it
        (S(X) + X * S(X) * S(-X), ("silu", X)),  # another form of the same
        ((3 * X * (1 - S(3 * X)) + 1) * S(3 * X), ("silu", 3 * X)),
        # symmetric in u and -u: the argument without a minus sign
        (S(X) * S(-X), ("sigmoid", X)),
        (sympy.cosh(X) ** -2, ("tanh", X)),
        (1 - sympy.tanh(2 * X) ** 2, ("tanh", 2 * X)),  # another form of the same
        (sympy.diff(X * sympy.tanh(sf.softplus(X)), X), ("mish", X)),
        # a number factor: the kernel would cost as much as the formula
        (2 * S(2 * X), None),
        (-S(-X), None),
        # equal at the probe points, not beyond a breakpoint (found in review)
        (sympy.Piecewise((S(X), X < 3), (1, True)), None),
        (S(sympy.Max(X, -5)), None),
        (S(X) * sympy.Heaviside(4 - X), None),
        (1 / (4 * sympy.cosh(X / 2) ** 2), None),  # no sigmoid to take an argument from
        (X**2, None),
        (S(X) + X, None),
        (S(X) ** 2, None),
        (S(X) * Y, None),  # not a number times a kernel
        (S(Y), None),  # an argument in another symbol (a param)
        (S(X) + sympy.Rational(1, 10**30) * X, None),  # close is not equal
    ],
)
def test_first_order_kernel_matches_exact_derivatives_only(derivative, expected):
    assert names(first_order_kernel(derivative, {X})) == expected


def test_every_kernel_is_a_real_derivative():
    """Each table entry's derivative is d/du of the function whose backward the kernel is."""
    u = X
    primitives = {
        "softplus": sympy.log(1 + sympy.exp(u)),
        "silu": u / (1 + sympy.exp(-u)),
        "sigmoid": 1 / (1 + sympy.exp(-u)),
        "tanh": sympy.tanh(u),
        "mish": u * sympy.tanh(sympy.log(1 + sympy.exp(u))),
    }
    assert {k.function for k in KERNELS} == set(primitives)
    for kernel in KERNELS:
        difference = sf.to_elementary(kernel.derivative(u)) - sympy.diff(primitives[kernel.function], u)
        for point in (-3.1, -0.2, 0.7, 4.4):
            assert abs(sympy.N(difference.subs(u, sympy.Float(point, 40)), 40)) < 1e-30


def test_kernel_calls_compute_their_derivatives():
    """The printed calls, run: upstream gradient times the derivative, in float64."""
    x = torch.linspace(-30, 30, 241, dtype=torch.float64)
    g = torch.linspace(0.5, 2.0, 241, dtype=torch.float64)
    s, sp = torch.sigmoid(x), torch.nn.functional.softplus(x)
    want = {
        "softplus": g * s,
        "silu": g * s * (1 + x * torch.sigmoid(-x)),
        "sigmoid": g * s * torch.sigmoid(-x),
        "tanh": g / torch.cosh(x) ** 2,
        "mish": g * (torch.tanh(sp) + x * s * (1 - torch.tanh(sp) ** 2)),
    }
    for kernel in KERNELS:
        code = syntax.source(kernel.call(syntax.name("g"), syntax.name("x")))
        got = eval(code, {"torch": torch, "g": g, "x": x})  # noqa: S307
        torch.testing.assert_close(got, want[kernel.function], rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    "expr",
    [
        "Min(x/(1+exp(-x)), 3)",
        "log(1+exp(Max(x, -5)))",
        "Piecewise((x/(1+exp(-x)), x < 3), (x, True))",
        "1/(1+exp(-Min(x, 4)))",
    ],
)
def test_no_kernel_where_the_gradient_has_a_breakpoint(expr):
    """Found in review: these matched a kernel at the probe points, and the first-order
    gradient beyond the breakpoint was the kernel's (SiLU's 1.07 at x = 3.5 where the
    truth is 0)."""
    source = generate_source(expr, "Kinked")
    assert "torch.ops.aten." not in source
    namespace = _run(source)
    x = torch.tensor([-8.0, -6.0, -1.0, 0.5, 2.0, 3.5, 5.0, 8.0], dtype=torch.float64, requires_grad=True)
    (first,) = torch.autograd.grad(namespace["kinked"](x).sum(), x)
    reference = x.detach().clone().requires_grad_()
    torch_form = {
        "Min(x/(1+exp(-x)), 3)": lambda t: torch.clamp_max(torch.nn.functional.silu(t), 3),
        "log(1+exp(Max(x, -5)))": lambda t: torch.nn.functional.softplus(torch.clamp_min(t, -5)),
        "Piecewise((x/(1+exp(-x)), x < 3), (x, True))": lambda t: torch.where(t < 3, torch.nn.functional.silu(t), t),
        "1/(1+exp(-Min(x, 4)))": lambda t: torch.sigmoid(torch.clamp_max(t, 4)),
    }[expr]
    (want,) = torch.autograd.grad(torch_form(reference).sum(), reference)
    torch.testing.assert_close(first, want, rtol=1e-12, atol=1e-12)


def _run(source: str) -> dict:
    """The names a generated module's source defines."""
    namespace: dict = {}
    exec(compile(source, "generated", "exec"), namespace)  # noqa: S102
    return namespace


def _module(expr: str, name: str, **options) -> dict:
    return _run(generate_source(expr, name, **options))


@pytest.mark.parametrize(
    "expr, kernel, count",
    [
        ("x/(1+exp(-x))", "silu_backward", 1),
        ("log(1+exp(x))", "softplus_backward", 1),
        ("1/(1+exp(-x))", "sigmoid_backward", 1),  # of sigmoid(-|x|)
        ("tanh(x)", "softplus_backward", 2),
        ("x*tanh(log(1+exp(x)))", "mish_backward", 1),
    ],
)
def test_generated_backward_calls_the_kernel_only_when_not_recording(expr, kernel, count, monkeypatch):
    source = generate_source(expr, "Act")
    # (Where double backward has a Function of its own, backward returns early with it.)
    recording = "if not torch.is_grad_enabled():" in source or "if torch.is_grad_enabled():" in source
    assert f"torch.ops.aten.{kernel}(" in source and recording
    namespace = _run(source)
    calls = []
    real = getattr(torch.ops.aten, kernel)

    class Spy:
        def __call__(self, *args):
            calls.append(kernel)
            return real(*args)

    monkeypatch.setattr(torch.ops.aten, kernel, Spy())
    x = torch.linspace(-5, 5, 11, dtype=torch.float64, requires_grad=True)
    (first,) = torch.autograd.grad(namespace["act"](x).sum(), x)
    assert calls == [kernel] * count
    (recorded,) = torch.autograd.grad(namespace["act"](x).sum(), x, create_graph=True)
    assert calls == [kernel] * count and recorded.requires_grad  # the formula, differentiable
    # (Mish's gradient nears its zero at -1.19, where any two roundings differ more.)
    torch.testing.assert_close(first, recorded.detach(), rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize(
    "expr, options",
    [
        ("x**2", {}),
        ("x/(1+exp(-x))", {"fuse": True}),  # one compiled kernel already
        ("y*x/(1+exp(-x))", {}),  # two inputs: not the kernel's alone
        ("sum(log(1+exp(x)))", {}),  # a reduction
        ("x/(1+exp(-x)), x**2", {}),  # two outputs reach x
    ],
)
def test_no_kernel_branch_where_it_would_not_be_the_whole_gradient(expr, options):
    assert "torch.ops.aten." not in generate_source(expr, "Other", **options)


@pytest.mark.parametrize(
    "expr, kernel",
    [("x/(1+exp(-x))", "silu"), ("x*tanh(log(1+exp(x)))", "mish")],
)
def test_save_speed_leaves_a_kernels_derivative_to_backward(expr, kernel):
    """--save speed returns no derivative that one kernel computes in backward: the kernel
    is faster than computing it in forward and multiplying (SiLU at 1e7: 13.8 ms against
    21.4), and saves nothing more. Forward runs the activation's own kernel
    (kernels.FORWARD_KERNELS), whose work no derivative could share anyway."""
    speed = generate_source(expr, "Act", save="speed")
    # (Forward returns no dresult_dx: only the input is saved.)
    assert f"torch.ops.aten.{kernel}_backward(" in speed and '"saved": ["x"]' in speed
    assert f"torch.nn.functional.{kernel}(_floating(x))" in speed
    memory = generate_source(expr, "Act")
    body = lambda source: source[source.index("class _ActNoJvp") :]  # noqa: E731
    assert body(speed) == body(memory)


@pytest.mark.parametrize(
    "expr, second",
    [
        ("log(1+exp(x))", lambda x: torch.sigmoid(x) * torch.sigmoid(-x)),
        ("1/(1+exp(-x))", lambda x: torch.sigmoid(x) * torch.sigmoid(-x) * torch.tanh(-x / 2)),
        ("tanh(x)", lambda x: -2 * torch.tanh(x) / torch.cosh(x) ** 2),
    ],
)
def test_forward_ad_through_a_first_order_kernel(expr, second):
    """softplus_backward has a forward derivative (for a negative beta too): a dual tensor
    through a first-order backward (no create_graph) gets the second derivative as its
    tangent."""
    from torch.autograd import forward_ad

    namespace = _module(expr, "Act")
    x = torch.linspace(-6, 6, 13, dtype=torch.float64, requires_grad=True)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        (grad,) = torch.autograd.grad(namespace["act"](dual).sum(), dual)
        tangent = forward_ad.unpack_dual(grad).tangent
    torch.testing.assert_close(tangent, second(x.detach()), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "expr, torch_function, kernel",
    [
        ("x/(1+exp(-x))", torch.nn.functional.silu, "silu_backward"),
        ("x*tanh(log(1+exp(x)))", torch.nn.functional.mish, "mish_backward"),
    ],
)
def test_forward_ad_through_silu_and_mish_backward_fails_as_with_torchs_own(expr, torch_function, kernel):
    """silu_backward and mish_backward have no forward derivative in torch: forward AD
    through a first-order backward fails for F.silu (F.mish) and the generated SiLU (Mish)
    alike (the README says so); with create_graph=True the formula runs and it works."""
    from torch.autograd import forward_ad

    namespace = _module(expr, "Act")
    x = torch.linspace(-6, 6, 13, dtype=torch.float64, requires_grad=True)
    for function in (torch_function, namespace["act"]):
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(x, torch.ones_like(x))
            with pytest.raises(NotImplementedError, match=kernel):
                torch.autograd.grad(function(dual).sum(), dual)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        (grad,) = torch.autograd.grad(namespace["act"](dual).sum(), dual, create_graph=True)
        tangent = forward_ad.unpack_dual(grad).tangent
    # (torch's own second derivative: its double backward runs a differentiable formula.)
    (first,) = torch.autograd.grad(torch_function(x).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x)
    torch.testing.assert_close(tangent, second, rtol=1e-12, atol=1e-15)


# -- forward kernels (kernels.FORWARD_KERNELS) ------------------------------------------

SP = sf.softplus


@pytest.mark.parametrize(
    "expr, expected",
    [
        (X * sympy.tanh(SP(X)), sf.mish(X)),
        (X * S(X), sf.silu(X)),
        (-SP(-X), sf.log_sigmoid(X)),
        (Y - SP(-X), Y + sf.log_sigmoid(X)),
        (2 * X * S(X), 2 * sf.silu(X)),
        ((X + Y) * S(X + Y), sf.silu(X + Y)),
        (X**2 * S(X), X * sf.silu(X)),  # subs finds the formula inside a power too
        (Y + X * sympy.tanh(SP(X)), Y + sf.mish(X)),
        (sympy.Piecewise((X * S(X), X > 0), (X, True)), sympy.Piecewise((sf.silu(X), X > 0), (X, True))),
        # the call stays: a silu would add a kernel, not replace one
        (X * S(X) + S(X), X * S(X) + S(X)),
        (S(X) * (X + 1), S(X) * (X + 1)),  # not the formula
        (Y * S(X), Y * S(X)),
        (SP(-X), SP(-X)),  # as many operations either way
        (sympy.tanh(SP(X)), sympy.tanh(SP(X))),
    ],
)
def test_forward_kernels_replace_whole_formulas_only(expr, expected):
    assert with_forward_kernels(expr)[0] == expected


def test_forward_kernel_functions_are_their_formulas():
    """Each function's mpmath value, elementary form and derivative are its formula's."""
    for kernel in FORWARD_KERNELS:
        applied = kernel.function(X)
        formula = sf.to_elementary(kernel.formula(X))
        for point in (-30.5, -3.1, -0.2, 0.0, 0.7, 4.4, 25.0):
            at = {X: sympy.Float(point, 40)}
            want = sympy.N(formula.subs(at), 40)
            for got in (applied.subs(at).evalf(40), sympy.N(applied.elementary().subs(at), 40)):
                assert abs(got - want) <= 1e-30 * (1 + abs(want))
            slope = sympy.N(sf.to_elementary(sympy.diff(applied, X)).subs(at), 40)
            assert abs(slope - sympy.N(sympy.diff(formula, X).subs(at), 40)) <= 1e-30 * (1 + abs(slope))


# Float32 inputs where torch.sigmoid underflows to 0 (below -88.7) but exp(x) does not: the
# formula gave Mish's value 0 there, where F.mish is right.
_EXTREME = [-1e30, -1e4, -110.0, -103.0, -100.0, -95.0, -92.0, -90.0, -89.0, -88.0, -30.0, -1.0,
            -1e-8, 0.0, 1e-8, 1.0, 20.0, 88.0, 100.0, 1e4, 1e30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "expr, exact",
    [
        ("x*tanh(log(1+exp(x)))", lambda u: u * mpmath.tanh(mpmath.log1p(mpmath.exp(u)))),
        ("x/(1+exp(-x))", lambda u: u / (1 + mpmath.exp(-u))),
        ("log(1/(1+exp(-x)))", lambda u: -mpmath.log1p(mpmath.exp(-u))),
    ],
)
def test_forward_kernels_are_as_accurate_as_torchs_own(expr, exact, dtype):
    """The generated forward calls the activation's kernel (one pass over memory), and its
    values are torch's own F.mish, F.silu and F.logsigmoid exactly; against 50-digit mpmath
    they are within 1e-5 (float32) and 1e-13 (float64) wherever the value is a normal
    float, except where torch's own kernel underflows (F.silu below -88.7 in float32)."""
    namespace = _module(expr, "Act")
    source = generate_source(expr, "Act")
    kernel = {"x*tanh": "mish", "x/(1+e": "silu", "log(1/": "logsigmoid"}[expr[:6]]
    assert f"torch.nn.functional.{kernel}(_floating(x))" in source
    x = torch.tensor(_EXTREME, dtype=dtype)
    got = namespace["act"](x)
    torch.testing.assert_close(got, getattr(torch.nn.functional, kernel)(x), rtol=0, atol=0)
    info = torch.finfo(dtype)
    with mpmath.workdps(50):
        for point, value in zip(x.tolist(), got.tolist()):
            want = exact(mpmath.mpf(point))
            if kernel == "silu" and dtype == torch.float32 and point < -88.7:
                continue  # (F.silu's own exp(-x) overflows there; see the README)
            if abs(want) < info.tiny:
                continue  # a subnormal value: a few bits, each step rounding them
            rtol = 1e-5 if dtype == torch.float32 else 1e-13  # (exp(x) itself may be subnormal)
            assert abs(value - want) <= rtol * abs(want), (point, value, want)


def test_mish_is_right_where_sigmoid_underflows():
    """Before FORWARD_KERNELS, Mish's forward came from torch.sigmoid, 0 for x in (-103.9,
    -88.7) in float32, where x*tanh(softplus(x)) is -1.98e-37 at -89 (found by an accuracy
    hunt, the README's open list)."""
    namespace = _module("x*tanh(log(1+exp(x)))", "Act")
    x = torch.tensor([-89.0, -92.0, -95.0], dtype=torch.float32)
    got = namespace["act"](x)
    want = torch.tensor([-1.9824e-37, -1.0202e-38, -5.2451e-40], dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=0)


@pytest.mark.parametrize("options", [{"fuse": True}, {"fuse": True, "save": "speed"}])
def test_fused_bodies_keep_the_formula(options):
    """Inductor compiles the formula into its one kernel: no activation call there."""
    source = generate_source("x*tanh(log(1+exp(x)))", "Act", **options)
    assert "torch.nn.functional.mish" not in source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_kernels_in_half_precision(dtype):
    """ATen's kernels compute in float32 for float16 and bfloat16 and round once."""
    for expr, kernel in (
        ("x*tanh(log(1+exp(x)))", torch.nn.functional.mish),
        ("x/(1+exp(-x))", torch.nn.functional.silu),
        ("log(1/(1+exp(-x)))", torch.nn.functional.logsigmoid),
    ):
        namespace = _module(expr, "Act")
        x = torch.linspace(-12, 12, 49, dtype=dtype, requires_grad=True)
        y = namespace["act"](x)
        assert y.dtype == dtype
        torch.testing.assert_close(y, kernel(x), rtol=0, atol=0)
        (grad,) = torch.autograd.grad(y.sum(), x)
        assert grad.dtype == dtype and torch.isfinite(grad).all()


@pytest.mark.parametrize(
    "expr, options",
    [
        # another output still needs the call: the kernel would add work (found in review)
        ("x*tanh(log(1+exp(x))), tanh(log(1+exp(x)))", {}),
        ("log(1/(1+exp(-x))), log(1+exp(-x))", {}),
        # --save speed returns a derivative that shares the formula's work (found in review)
        ("sum(x*tanh(log(1+exp(x))))", {"save": "speed"}),
        ("exp(x*tanh(log(1+exp(x))))", {"save": "speed"}),
        ("y*x/(1+exp(-x))", {"save": "speed"}),
    ],
)
def test_no_forward_kernel_where_it_adds_work(expr, options):
    source = generate_source(expr, "Act", **options)
    assert "_floating(" not in source
    if options:
        assert "dresult_dx" in source.split('"saved":')[1].split("\n")[0]


@pytest.mark.parametrize("expr", ["x/(1+exp(-x))", "x*tanh(log(1+exp(x)))"])
def test_forward_kernels_take_integer_and_bool_inputs(expr):
    """F.silu and F.mish have no integer kernel; the formula's torch.sigmoid promotes
    (found in review: NotImplementedError for 'Long')."""
    namespace = _module(expr, "Act")
    kernel = torch.nn.functional.silu if expr.startswith("x/") else torch.nn.functional.mish
    for x in (torch.tensor([-2, 0, 3]), torch.tensor([True, False])):
        got = namespace["act"](x)
        assert got.dtype == torch.get_default_dtype()
        torch.testing.assert_close(got, kernel(x.to(torch.get_default_dtype())))
