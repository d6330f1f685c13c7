"""Fused mode (--fuse): what test_generated.py cannot see from the outside.

test_generated.py checks every contract (gradcheck, gradgradcheck, vmap, jacfwd/jacrev,
torch.compile, dtypes) on whatever is in generated/, fused modules included. Here:
the fused module really runs its compiled bodies (a silent eager fallback would pass
every contract and lose all the speed), agrees with the default module, and the
options that cannot be fused are refused.
"""

from __future__ import annotations

import importlib
import math
import sys

import mpmath
import pytest
import torch

import symgrad
from code_text import code
from conftest import compiled_at_every_size
from test_fuzz import import_source

EXPR = "alpha*x*y + log(1 + y**2)*exp(-x)"


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """The default and the fused module for one broadcasting, two-input expression with a param."""
    root = tmp_path_factory.mktemp("fused")
    package = root / "fused_modules"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, fuse in (("Plain", False), ("Fused", True)):
        source = symgrad.generate_source(EXPR, name, inputs=["x", "y"], params=["alpha"], fuse=fuse)
        (package / f"{name.lower()}.py").write_text(source)
    sys.path.insert(0, str(root))
    try:
        fused = compiled_at_every_size(importlib.import_module("fused_modules.fused"))
        yield importlib.import_module("fused_modules.plain"), fused
    finally:
        sys.path.remove(str(root))


def inputs(device, dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, generator=generator, dtype=dtype).to(device).requires_grad_()
    y = torch.rand(4, generator=generator, dtype=dtype).to(device).requires_grad_()
    return x, y


@pytest.mark.parametrize(
    "text, params", [("x*sigmoid(beta*x)", ["beta"]), ("sin(x)*Piecewise((2.5, x > 1), (1, True))", [])]
)
def test_numbers_made_tensors_compile(text, params, tmp_path, device):
    """A number made a tensor beside an input (a param in a torch function, a Piecewise of
    numbers) takes its dtype from the helper _dtype_with, which Dynamo traces: with
    torch.result_type, fused bodies fell back to eager, 4-5x slower, and torch.compile of the
    default module with fullgraph=True failed (found in review)."""
    args = [0.5] if params else []
    plain = import_source(symgrad.generate_source(text, "NumPlain", params=params), tmp_path)
    fused = compiled_at_every_size(import_source(symgrad.generate_source(text, "NumFused", params=params, fuse=True), tmp_path))
    x = torch.linspace(-3, 3, 7, dtype=torch.float64, device=device, requires_grad=True)
    want = plain.num_plain(x, *args)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    got = fused.num_fused(x, *args)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    assert fused._num_fused_forward in fused._COMPILED
    with torch.no_grad():
        torch.testing.assert_close(fused._COMPILED[fused._num_fused_forward](x.detach(), *args), want.detach())
    torch._dynamo.reset()
    compiled = torch.compile(plain.num_plain, fullgraph=True, backend="aot_eager")(x, *args)
    torch.testing.assert_close(compiled, want)


def test_fused_source_uses_the_fused_template(modules):
    _, fused = modules
    source = open(fused.__file__).read()
    assert " from fused.py.jinja (" in source.splitlines()[0]
    assert "torch.compile(body, fullgraph=True)" in source
    assert fused._COMPILED == {} or all(callable(f) for f in fused._COMPILED.values())


def test_fused_matches_default_and_compiles_its_bodies(modules, device):
    plain, fused = modules
    for alpha in (0.7, torch.tensor(0.7, dtype=torch.float64, device=device)):
        x, y = inputs(device)
        want = plain.plain(x, y, alpha)
        want_grads = torch.autograd.grad(want.sum(), (x, y))
        got = fused.fused(x, y, alpha)
        got_grads = torch.autograd.grad(got.sum(), (x, y))
        torch.testing.assert_close(got, want)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)
    # Both bodies were compiled, and calling the compiled ones directly works: the eager
    # fallback in _fused was not what produced the results above.
    assert set(fused._COMPILED) == {fused._fused_forward, fused._fused_backward}
    x, y = (t.detach() for t in inputs(device))
    with torch.no_grad():
        torch.testing.assert_close(
            fused._COMPILED[fused._fused_forward](x, y, 0.7), plain.Plain.forward(x, y, 0.7)
        )


def test_new_shapes_compile_once_more_for_all_sizes(modules, device):
    """The bodies compile for the first shape (a specialised, faster kernel); the second
    shape recompiles them for any size, as torch.compile does by default, and every later
    size reuses that."""
    from torch._dynamo.utils import counters

    plain, fused = modules
    fused.fused(*inputs(device), 0.7).sum().backward()  # compiled for (3, 4) and (4,) already
    graphs = counters["stats"]["unique_graphs"]
    for rows in (5, 6, 9, 11):
        x = torch.rand(rows, 4, dtype=torch.float64, device=device, requires_grad=True)
        y = torch.rand(4, dtype=torch.float64, device=device, requires_grad=True)
        got = torch.autograd.grad(fused.fused(x, y, 0.7).sum(), (x, y))
        want = torch.autograd.grad(plain.plain(x, y, 0.7).sum(), (x, y))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    # One recompile each for forward and backward, none for the sizes after the second.
    assert counters["stats"]["unique_graphs"] - graphs == 2


def test_double_backward_runs_the_eager_body(modules, device):
    plain, fused = modules
    x, y = inputs(device)
    (gx,) = torch.autograd.grad(fused.fused(x, y, 0.7).sum(), x, create_graph=True)
    (hx,) = torch.autograd.grad(gx.sum(), x)
    x2, y2 = inputs(device)
    (gx2,) = torch.autograd.grad(plain.plain(x2, y2, 0.7).sum(), x2, create_graph=True)
    (hx2,) = torch.autograd.grad(gx2.sum(), x2)
    torch.testing.assert_close(hx, hx2)


MP_FUNCTIONS = {
    "tanh(x)": mpmath.tanh,
    "1/(1+exp(-x))": lambda v: 1 / (1 + mpmath.exp(-v)),
    "x*tanh(log(1+exp(x)))": lambda v: v * mpmath.tanh(mpmath.log(1 + mpmath.exp(v))),
}


@pytest.mark.parametrize("expr", sorted(MP_FUNCTIONS))
def test_fused_cheaper_forms_keep_double_backward_exact(expr, tmp_path, device):
    """The fused bodies compute tanh's 1/cosh(x)**2 and sigmoid's derivative from one sigmoid
    of -|x|, and Mish from one sigmoid (cost.cheaper_fused_form); double backward
    differentiates those bodies eagerly, so they must be exact under autograd too, at 0 and
    in the tails."""
    fused = import_source(symgrad.generate_source(expr, "CheapFused", fuse=True), tmp_path)
    points = [-30.0, -2.5, -1e-3, 0.0, 1e-3, 0.7, 4.0, 18.0, 30.0]
    x = torch.tensor(points, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradgradcheck(fused.cheap_fused, (x,))
    (g,) = torch.autograd.grad(fused.cheap_fused(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    with mpmath.workdps(60):
        want = [float(mpmath.diff(MP_FUNCTIONS[expr], mpmath.mpf(p), 2)) for p in points]
    want = torch.tensor(want, dtype=torch.float64, device=device)
    torch.testing.assert_close(h, want, rtol=1e-9, atol=1e-13)
    # Far in the tail (second derivatives below 1e-13), 1 - sigmoid(x) has lost digits in
    # float64, but the value stays right to 1% (the default module's is 0 at x = 30). (The
    # atol is for sigmoid's 0 at x = 0, which mpmath's numerical derivative gives as 1e-74.)
    torch.testing.assert_close(h, want, rtol=1e-2, atol=1e-30)
    # The third derivative too: the where(x > 0, -x, x) of -|x| has slope -1 or 1 on each
    # side, where abs's would be 0 at x = 0 (and tanh's third derivative there is -2).
    x = torch.tensor(points[1:-1], dtype=torch.float64, device=device, requires_grad=True)
    (g,) = torch.autograd.grad(fused.cheap_fused(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    (k,) = torch.autograd.grad(h.sum(), x)
    with mpmath.workdps(60):
        want = [float(mpmath.diff(MP_FUNCTIONS[expr], mpmath.mpf(p), 3)) for p in points[1:-1]]
    torch.testing.assert_close(k, torch.tensor(want, dtype=torch.float64, device=device), rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize(
    "expr, compiled",
    [
        ("2*x", set()),
        ("-x", set()),  # (grad_output * -1: the -1 is a constant, not an operation)
        ("x + 1", set()),  # (backward is grad_output itself: no operation)
        ("exp(x)", {"forward"}),
        ("x**3", {"backward", "jvp"}),
        ("sin(x)*x", {"forward", "backward", "jvp"}),
        # grad_output * 2 * x: the 0-d gradient of a sum times 2 is no pass over memory, and
        # expand makes a view; forward and jvp reduce, which inductor does as well as ATen.
        ("sum(x**2)", {"forward", "jvp"}),
        # (grad_output / shape.numel() * 2 * x: the mean's 0-d gradient is divided first)
        ("mean(x**2)", {"forward", "jvp"}),
        # torch.expm1: inductor's CPU kernel is exp(x) - 1, inaccurate near 0 (plan.INDUCTOR_INACCURATE)
        ("exp(x) - 1", {"backward", "jvp"}),
        ("atanh(x/2)", {"backward", "jvp"}),
    ],
)
def test_one_elementwise_operation_runs_eagerly(expr, compiled, tmp_path, device):
    """A body that is one elementwise operation (2*x, grad_output*result) is called directly:
    an eager kernel is as fast, and the compiled call would add only a guard check. So is a
    body that calls a function inductor computes inaccurately. Any other body with more, or
    with a function call, runs compiled."""
    module = compiled_at_every_size(import_source(symgrad.generate_source(expr, "OneOp", fuse=True), tmp_path))
    x = torch.rand(5, dtype=torch.float64, device=device, requires_grad=True)
    y = module.one_op(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x.detach(), torch.ones_like(x))
        (tangent,) = (torch.autograd.forward_ad.unpack_dual(module.one_op(dual)).tangent,)
    bodies = {name: getattr(module, f"_one_op_{name}") for name in ("forward", "backward", "jvp")}
    assert {name for name, body in bodies.items() if body in module._COMPILED} == compiled
    x2 = x.detach().requires_grad_()
    want = {
        "2*x": 2 * x2,
        "-x": -x2,
        "x + 1": x2 + 1,
        "exp(x)": torch.exp(x2),
        "x**3": x2**3,
        "sin(x)*x": torch.sin(x2) * x2,
        "sum(x**2)": (x2**2).sum(),
        "mean(x**2)": (x2**2).mean(),
        "exp(x) - 1": torch.expm1(x2),
        "atanh(x/2)": torch.atanh(x2 / 2),
    }[expr]
    (want_g,) = torch.autograd.grad(want.sum(), x2)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(g, want_g)
    torch.testing.assert_close(tangent, want_g.sum() if expr.startswith(("sum", "mean")) else want_g)


@pytest.mark.parametrize(
    "returns, scalars, eager",
    [
        ("(g * 2 * a * x).expand(shape)", {"g", "a"}, True),  # g of a sum, a number param
        ("(g * 2 * a * x).expand(shape)", {"a"}, False),  # g full-size: two passes
        ("g * -x", {"g"}, False),  # (-x is a pass of its own)
        ("g * -1", set(), True),  # (a negated constant is no operation of its own)
        ("g * x * x", {"g"}, False),
        ("torch.exp(g * x)", {"g"}, False),  # a call stays compiled
        ("(g * x).sum()", {"g"}, False),  # a reduction is a call
        ("((g / shape.numel()) * 2 * x).expand(shape)", {"g"}, True),  # numel: an int
        ("g * (x > 0)", {"g"}, False),  # (a comparison on a tensor is a kernel of its own)
    ],
)
def test_operations_between_scalars_are_not_passes_over_memory(returns, scalars, eager):
    """plan.one_elementwise_operation counts operations on full-size tensors only: an
    operation between 0-d tensors or numbers costs no pass over memory."""
    from symgrad.plan import Method, one_elementwise_operation

    body = Method(("g", "x", "a", "shape"), (), (code(returns),))
    assert one_elementwise_operation(body, frozenset(scalars)) is eager


def _fresh_module(tmp_path, expr: str, name: str, **options):
    """Generate and import a fused module, with its own small-tensor limit left as generated."""
    return import_source(symgrad.generate_source(expr, name, fuse=True, **options), tmp_path)


def _operations(module, body_name: str) -> int:
    """The ``operations=`` count the module passes to the runner for this body."""
    import re

    source = open(module.__file__).read()
    return int(re.search(rf"_fused\(\s*_{body_name}\b.*?operations=(\d+)\)", source, re.S).group(1))


def test_small_cpu_tensors_run_the_bodies_eagerly(tmp_path, device):
    """On a CPU a compiled call costs more than a short body's eager kernels on a small tensor,
    so the runner calls the body directly there: no compile, the same values. Past the limit
    (operations times 8192 more than the elements), on another device, or in float16 and
    bfloat16, the bodies compile."""
    module = _fresh_module(tmp_path, "sin(x)*x", "SinTimes")
    operations = {kind: _operations(module, f"sin_times_{kind}") for kind in ("forward", "backward")}
    # (forward sin, *; backward grad_output * (x * cos(x) + sin(x)): *, cos, +, sin, *)
    assert operations == {"forward": 2, "backward": 5}
    limit = module._EAGER_WORK_LIMIT
    assert limit == 2**17

    def check(numel: int) -> None:
        x = torch.rand(numel, dtype=torch.float64, device=device, requires_grad=True)
        y = module.sin_times(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        x2 = x.detach().requires_grad_()
        want = torch.sin(x2) * x2
        torch.testing.assert_close(y, want)
        torch.testing.assert_close(g, torch.autograd.grad(want.sum(), x2)[0])

    def largest_eager(kind: str) -> int:
        """The most elements for which operations * (8192 + elements) < limit."""
        return (limit - 1) // operations[kind] - 8192

    forward, backward = module._sin_times_forward, module._sin_times_backward
    check(largest_eager("backward"))  # (18022 elements) both bodies run eagerly
    assert set(module._COMPILED) == (set() if device.type == "cpu" else {forward, backward})
    check(largest_eager("backward") + 1)  # backward compiles, forward still runs eagerly
    assert set(module._COMPILED) == ({backward} if device.type == "cpu" else {forward, backward})
    check(largest_eager("forward") + 1)  # (57344 elements)
    assert set(module._COMPILED) == {forward, backward}


def test_small_tensor_limit_zero_compiles_every_call(tmp_path, device):
    module = _fresh_module(tmp_path, "sin(x)*x", "SinTimes")
    module._EAGER_WORK_LIMIT = 0
    x = torch.rand(3, dtype=torch.float64, device=device, requires_grad=True)
    module.sin_times(x).sum().backward()
    assert set(module._COMPILED) == {module._sin_times_forward, module._sin_times_backward}


def test_long_bodies_compile_even_on_small_tensors(tmp_path, device):
    """Each eager operation costs a few microseconds of its own: a body of 16 or more runs
    compiled at any size (the bench's 20-operation expression, 24 operations in forward and
    49 in backward, is faster compiled even at 256 elements)."""
    expr = "x*sin(x) + cos(x)*exp(-x) + tanh(x)*x**2 + log(1 + x**2) + sqrt(1 + x**2) + atan(x)/(2 + x)"
    module = _fresh_module(tmp_path, expr, "LongBody")
    assert _operations(module, "long_body_forward") > 16
    x = torch.rand(8, dtype=torch.float64, device=device, requires_grad=True)
    module.long_body(x).sum().backward()
    assert module._long_body_forward in module._COMPILED


def test_small_inputs_that_broadcast_to_a_large_result_compile(tmp_path, device):
    """The size that counts is the result's: x of (n, 1) and y of (1, n) make n * n elements
    (a forward of 6 operations on 1000 * 1000 ran 2.9x slower eagerly, found in review)."""
    module = _fresh_module(tmp_path, "x*sin(y) + y*exp(-x)", "Outer", inputs=["x", "y"])
    for n, compiled in ((8, False), (1000, True)):
        x = torch.rand(n, 1, dtype=torch.float64, device=device)
        y = torch.rand(1, n, dtype=torch.float64, device=device)
        torch.testing.assert_close(module.outer(x, y), x * torch.sin(y) + y * torch.exp(-x))
        assert (module._outer_forward in module._COMPILED) is (compiled or device.type != "cpu"), n


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_always_compiles(dtype, tmp_path, device):
    """A compiled body computes float16 and bfloat16 in float32 and rounds once; eager kernels
    round at every step (GELU's bfloat16 value 2.7e-2 off eagerly, 3.8e-3 compiled, found in
    review). So small tensors of those dtypes still compile, and their size never decides."""
    module = _fresh_module(tmp_path, "sin(x)*x", "SinTimesHalf")
    x = torch.rand(5, dtype=torch.float64, device=device)
    y = module.sin_times_half(x.to(dtype))
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), torch.sin(x) * x, rtol=1e-2, atol=1e-2)
    assert set(module._COMPILED) == {module._sin_times_half_forward}


def test_value_body_with_an_inaccurate_inductor_call_runs_eagerly(tmp_path):
    """Under no_grad a --save speed module computes its outputs alone, with the forward's
    rules: a value body calling expm1 (inductor's CPU kernel is exp(x) - 1) runs eagerly at
    any size, as forward does (it compiled before, 4.6e-2 off at x = 1e-6; found in review)."""
    module = _fresh_module(tmp_path, "x*(exp(x) - 1)", "Expm1Value", save="speed")
    source = open(module.__file__).read()
    assert "return _expm1_value_value(x)" in source
    x = torch.full((200_000,), 1e-6, dtype=torch.float32)
    with torch.no_grad():
        y = module.expm1_value(x)
    want = torch.full_like(x, 1e-6 * 1.0000005e-6)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=0)
    assert module._COMPILED == {}


def test_jvp_calling_an_inaccurate_inductor_function_through_its_derivative_runs_eagerly(tmp_path):
    """A jvp takes its derivatives from SecondDerivative (exact in reverse mode), whose
    forward runs inside the jvp body: log(1-exp(-x))'s is 1/expm1(x), so the body runs
    eagerly, as one calling expm1 itself does (it compiled, 5% off at x = 1e-6 in float32;
    found in review). Its operations count the Function's forward too."""
    import torch.autograd.forward_ad as forward_ad

    module = _fresh_module(tmp_path, "log(1-exp(-x))", "Log1mexpJvp")
    source = open(module.__file__).read()
    assert "_Log1mexpJvpDerivative.apply(x)" in source
    assert "return _log1mexp_jvp_jvp(x_tangent, x)" in source
    x = torch.full((200_000,), 1e-6, dtype=torch.float32)
    with forward_ad.dual_level():
        tangent = forward_ad.unpack_dual(module.log1mexp_jvp(forward_ad.make_dual(x, torch.ones_like(x)))).tangent
    want = 1 / math.expm1(x[0].item())  # (the float32 point, exactly)
    torch.testing.assert_close(tangent, torch.full_like(x, want), rtol=1e-6, atol=0)
    assert module._log1mexp_jvp_jvp not in module._COMPILED
    mish = _fresh_module(tmp_path, "x*tanh(log(1+exp(x)))", "MishJvp")
    assert "_MishJvpDerivative.apply(x)" in open(mish.__file__).read() and _operations(mish, "mish_jvp_jvp") > 10


@pytest.mark.parametrize("limit", [0, 2**17])
def test_inference_runs_the_value_body_through_the_runner(limit, tmp_path, device):
    """Under no_grad a fused --save speed module computes the outputs alone (no derivatives),
    compiled or, on small CPU tensors, eagerly."""
    module = _fresh_module(tmp_path, "x*tanh(log(1+exp(x)))", "MishValue", save="speed")
    module._EAGER_WORK_LIMIT = limit
    x = torch.linspace(-3, 3, 7, dtype=torch.float64, device=device)
    with torch.no_grad():
        y = module.mish_value(x)
    torch.testing.assert_close(y, x * torch.tanh(torch.nn.functional.softplus(x)))
    assert set(module._COMPILED) == (set() if limit and device.type == "cpu" else {module._mish_value_value})


@pytest.mark.parametrize(
    "returns, scalars, operations",
    [
        ("torch.exp(x) * 2 + x", set(), 3),
        ("torch.where(x > 0, -x, x)", set(), 3),  # where, >, and -x
        ("(g * 2 * a * x).expand(shape)", {"g", "a"}, 1),  # only * x touches a full-size tensor
        ("g * (a > 1)", {"g", "a"}, 0),
        ("g * x.sum()", set(), 2),
    ],
)
def test_eager_operations_counts_kernels(returns, scalars, operations):
    """plan.eager_operations counts what the eager body launches: operators and comparisons on
    tensors, and calls (a view or a Python int is none)."""
    from symgrad.plan import Method, eager_operations

    body = Method(("g", "x", "a", "shape"), (), (code(returns),))
    assert eager_operations(body, frozenset(scalars)) == operations


def test_fuse_and_inplace_are_refused():
    with pytest.raises(symgrad.SymgradError, match="--fuse"):
        symgrad.generate_source("exp(x)", "ExpFused", inplace=True, fuse=True)
