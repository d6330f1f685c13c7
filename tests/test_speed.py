"""--save speed against the default (--save memory): same values, gradients and second
derivatives; backward only multiplies; forward's extra outputs are the derivatives.

The generic contract (gradcheck, gradgradcheck, forward AD, vmap, torch.compile, dtypes)
runs on the checked-in speed modules in tests/test_generated.py; this file compares the two
policies on expressions chosen for their shapes: broadcasting, reductions, params, several
outputs, and a derivative that only the default form can express.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import symgrad
from test_fuzz import import_source
from symgrad.plan.docs import metadata_of

CASES = [
    ("x/2*(1+erf(x/sqrt(2)))", None, None),
    ("sqrt(x)+1/x", None, None),
    ("alpha*x*y + log(1 + y**2)*exp(-x)", ["x", "y"], ["alpha"]),
    ("sum(x*exp(-y)), sin(x)*cos(y)", ["x", "y"], None),
    ("exp(y)*sin(x), x*y", ["x", "y"], None),
    ("mean(softplus(x)*x)", None, None),
    # sign(sin(acosh(x))) cannot be differentiated twice by SymPy: that entry stays recomputed.
    ("sin(x)*exp(x) + Abs(sin(acosh(x)))", None, None),
    # d/dx is recomputed (cheap) and passes a number param to torch.sin (review find).
    ("sin(alpha)*x + exp(y)*y**2", ["x", "y"], ["alpha"]),
    # Equal derivatives (d/dx = d/dy) are one output; d/dx exp(x + 1) is the output itself.
    ("cos(x + y)", None, None),
    ("exp(x + 1)", None, None),
]
SHAPES = [(3, 4), (4,)]


def _modules(tmp_path, expr, inputs, params):
    modules = []
    for save in ("memory", "speed"):
        source = symgrad.generate_source(expr, f"Case{save.title()}", inputs=inputs, params=params, save=save)
        modules.append(import_source(source, tmp_path))
    return modules


def _sample(module):
    meta = metadata_of(module)
    generator = torch.Generator().manual_seed(0)
    args = []
    for index, name in enumerate(meta["inputs"]):
        low, high = meta["domain"][name]
        x = low + (high - low) * torch.rand(SHAPES[index % 2], generator=generator, dtype=torch.float64)
        args.append(x.requires_grad_())
    return args, list(meta["params"].values())


def _alias(module):
    return getattr(module, metadata_of(module)["alias"])


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("expr, inputs, params", CASES, ids=[c[0] for c in CASES])
def test_speed_matches_memory_to_second_order(expr, inputs, params, tmp_path):
    memory, speed = _modules(tmp_path, expr, inputs, params)
    assert metadata_of(speed)["save"] == "speed" and metadata_of(memory)["save"] == "memory"
    args, numbers = _sample(memory)
    results = []
    for module in (memory, speed):
        outputs = _as_tuple(_alias(module)(*args, *numbers))
        assert len(outputs) == len(metadata_of(memory)["outputs"])  # the alias hides the derivatives
        upstream = [torch.full_like(o, 0.7) + 0.1 * torch.arange(o.numel()).reshape(o.shape) for o in outputs]
        grads = torch.autograd.grad(outputs, args, upstream, create_graph=True)
        weights = [torch.linspace(-1, 1, g.numel(), dtype=g.dtype).reshape(g.shape) for g in grads]
        # A gradient that is constant (sin(alpha) for x) has no graph: its second derivative is 0.
        pairs = [(g, w) for g, w in zip(grads, weights) if g.requires_grad]
        second = torch.autograd.grad([g for g, _ in pairs], args, [w for _, w in pairs], allow_unused=True)
        results.append((outputs, grads, second))
    for (want_out, want_grad, want_second), (got_out, got_grad, got_second) in zip([results[0]], [results[1]]):
        for want, got in zip(want_out + want_grad, got_out + got_grad):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        for want, got in zip(want_second, got_second):
            if want is None or got is None:
                assert (want is None or not want.any()) and (got is None or not got.any())
            else:
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("expr, inputs, params", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_apply_returns_the_derivatives(expr, inputs, params, tmp_path):
    memory, speed = _modules(tmp_path, expr, inputs, params)
    args, numbers = _sample(speed)
    outputs = getattr(speed, metadata_of(speed)["function"]).apply(*args, *numbers)
    result, derivatives = outputs[0], outputs[1:]
    assert len(derivatives) == len(args)  # every derivative here is costly enough to return
    grads = torch.autograd.grad(_alias(memory)(*args, *numbers).sum(), args)
    for derivative, grad, x in zip(derivatives, grads, args):
        torch.testing.assert_close(torch.broadcast_to(derivative, result.shape).sum_to_size(x.shape), grad)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def test_backward_only_multiplies(tmp_path):
    """GELU: backward is one multiplication (default mode recomputes erfc and exp, and the
    arithmetic around them)."""
    memory, speed = _modules(tmp_path, "x/2*(1+erf(x/sqrt(2)))", None, None)
    counts = {}
    for module in (memory, speed):
        x = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
        y = _alias(module)(x)
        upstream = torch.ones_like(y)
        with _CountOps() as mode:
            (grad,) = torch.autograd.grad(y, x, upstream)
        counts[metadata_of(module)["save"]] = mode.ops
    # (detach: unpacking the saved output, no arithmetic)
    assert [op for op in counts["speed"] if op != "detach"] == ["mul"]
    assert len(counts["memory"]) > 4 and "erfc" in counts["memory"]


def test_saved_tensors_are_the_input_and_the_derivative(tmp_path):
    _, speed = _modules(tmp_path, "x/2*(1+erf(x/sqrt(2)))", None, None)
    assert metadata_of(speed)["saved"] == ["x", "dresult_dx"]
    packed = []
    x = torch.linspace(-3, 3, 7, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        _alias(speed)(x)
    assert len(packed) == 2 and packed[0] is x


def test_cheap_derivatives_are_not_returned(tmp_path):
    """--save speed changes nothing where returning the derivative saves no time: it costs at
    most one operation (2*x, exp(x) = result), shares no work with the output (3*x**2
    next to x**3), or one of ATen's backward kernels computes it faster (softplus's
    sigmoid(x): symgrad.rewrite.kernels)."""
    for expr in ("2*x", "exp(x)", "x**2", "x**3", "log(1+exp(x))"):
        memory = symgrad.generate_source(expr, "Case")
        speed = symgrad.generate_source(expr, "Case", save="speed")
        # The header and metadata record the option; the classes must not differ.
        assert memory[memory.index("\nclass ") :] == speed[speed.index("\nclass ") :], expr


def test_speed_with_inplace_is_refused():
    with pytest.raises(symgrad.SymgradError, match="--save speed and --inplace cannot be combined"):
        symgrad.generate_source("exp(x)", "Both", save="speed", inplace=True)


# Outputs that are one tensor in SymPy's eyes: each must still be a tensor of its own, or
# forward-mode AD and torch.compile fail (review find).
SAME_TENSOR = ["exp(x + 1)", "cos(x + y)", "exp(x + y)", "sin(x)*x, sin(x)*x", "exp(y)*sin(x), x*y"]


@pytest.mark.parametrize("save", ["memory", "speed"])
@pytest.mark.parametrize("expr", SAME_TENSOR)
def test_forward_ad_and_compile_with_equal_outputs(expr, save, tmp_path):
    module = import_source(symgrad.generate_source(expr, "Same", save=save), tmp_path)
    fn = _alias(module)
    args, _ = _sample(module)
    assert torch.autograd.gradcheck(fn, tuple(args), check_forward_ad=True)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for got, want in zip(_as_tuple(compiled(*args)), _as_tuple(fn(*args))):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("save", ["memory", "speed"])
def test_tangent_has_the_output_dtype(save, tmp_path):
    """float16 x and float32 y: the output and its tangent are float32 (review find: the
    tangent took the first saved tensor's dtype)."""
    module = import_source(symgrad.generate_source("x*sin(y)*exp(y)", "Mixed", save=save), tmp_path)
    x = torch.rand(5, dtype=torch.float16)
    y = torch.rand(5, dtype=torch.float32)
    for tangents in ((torch.ones_like(x), torch.ones_like(y)), (torch.ones_like(x), torch.zeros_like(y))):
        out, tangent = torch.func.jvp(_alias(module), (x, y), tangents)
        assert out.dtype == tangent.dtype == torch.float32
        want = tangents[0].float() * torch.sin(y) * torch.exp(y) + tangents[1] * x.float() * torch.exp(y) * (
            torch.sin(y) + torch.cos(y)
        )
        torch.testing.assert_close(tangent, want, rtol=1e-5, atol=1e-5)


def test_zero_tangent_where_no_tangent_reaches(tmp_path):
    module = import_source(symgrad.generate_source("exp(y), x*y", "Split2", inputs=["x", "y"]), tmp_path)
    import torch.autograd.forward_ad as fwAD

    x = torch.rand(3, dtype=torch.float64)
    y = torch.rand(3, dtype=torch.float32)
    with fwAD.dual_level():
        first, second = _alias(module)(fwAD.make_dual(x, torch.ones_like(x)), y)
        zero = fwAD.unpack_dual(first).tangent
        assert zero.dtype == torch.float32 and not zero.any()
        torch.testing.assert_close(fwAD.unpack_dual(second).tangent, y.double())


def test_inference_skips_the_derivatives(tmp_path):
    """Under no_grad the alias computes the outputs alone: the same ops as the default."""
    memory, speed = _modules(tmp_path, "x*tanh(log(1+exp(x)))", None, None)
    x = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    counts, values = {}, {}
    for module in (memory, speed):
        with torch.no_grad(), _CountOps() as mode:
            values[metadata_of(module)["save"]] = _alias(module)(x)
        counts[metadata_of(module)["save"]] = mode.ops
    assert counts["speed"] == counts["memory"]
    torch.testing.assert_close(values["speed"], values["memory"], rtol=0, atol=0)


def test_fused_returns_only_derivatives_that_share_transcendental_work():
    """In a fused kernel sqrt(x) and 1/x cost nothing next to memory traffic: sqrt(x) + 1/x
    returns its derivative in eager mode (fewer kernels) but not with --fuse; Mish does both."""
    import re

    def saved(expr, **options):
        source = symgrad.generate_source(expr, "Case", save="speed", **options)
        return re.search(r'"saved": (\[.*?\])', source).group(1)

    assert saved("sqrt(x)+1/x") == '["x", "dresult_dx"]'
    assert saved("sqrt(x)+1/x", fuse=True) == '["x"]'
    assert saved("x*tanh(log(1+exp(x)))", fuse=True) == '["x", "dresult_dx"]'
