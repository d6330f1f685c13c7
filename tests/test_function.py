"""symgrad.function: the generated Function class, loaded in this process (for notebooks)."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import symgrad
from symgrad import SymgradError


def test_returns_the_class_with_its_alias_and_the_right_values():
    SqrtInverse = symgrad.function("sqrt(x)+1/x", "SqrtInverse")
    assert issubclass(SqrtInverse, torch.autograd.Function) and SqrtInverse.__name__ == "SqrtInverse"
    x = torch.tensor([4.0, 0.25], dtype=torch.float64, requires_grad=True)
    for call in (SqrtInverse.apply, SqrtInverse.functional):
        y = call(x)
        torch.testing.assert_close(y, x.detach().sqrt() + 1 / x.detach())
        (grad,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(grad, 0.5 / x.detach().sqrt() - 1 / x.detach() ** 2)
        assert gradcheck(call, (x,)) and gradgradcheck(call, (x,))


def test_runs_the_text_generate_source_returns():
    Blend = symgrad.function("alpha*x*y + exp(-x)", "Blend", params=["alpha"], domain={"x": (0.1, 10)}, save="speed")
    module = sys.modules[Blend.__module__]
    expected = symgrad.generate_source(
        "alpha*x*y + exp(-x)", "Blend", params=["alpha"], domain={"x": (0.1, 10)}, save="speed"
    )
    assert inspect.getsource(module) == expected  # (linecache holds the text, for tracebacks)
    assert module.blend is Blend.functional and module.__symgrad__["domain"]["x"] == (0.1, 10.0)
    x, y = (torch.rand(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert gradcheck(lambda a, b: Blend.functional(a, b, 0.5), (x, y))


def test_compiles_through_the_alias():
    """Through the alias (the class's jvp is one Dynamo refuses), in the module's own
    sys.modules entry."""
    Mish = symgrad.function("x*tanh(log(1+exp(x)))", "Mish")
    torch._dynamo.reset()
    compiled = torch.compile(Mish.functional, fullgraph=True, backend="aot_eager")
    x = torch.linspace(-5, 5, 11, requires_grad=True)
    eager_x = x.detach().clone().requires_grad_()
    got, want = compiled(x), Mish.functional(eager_x)
    torch.testing.assert_close(got, torch.nn.functional.mish(x.detach()))
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)


def test_two_calls_with_one_name_do_not_clash():
    first = symgrad.function("x**3", "Power")
    second = symgrad.function("x**2", "Power")
    assert first.__module__ != second.__module__ and first is not second
    x = torch.tensor([2.0])
    assert first.functional(x).item() == 8.0 and second.functional(x).item() == 4.0
    assert first.apply(x).item() == 8.0  # the first keeps its own module


@pytest.mark.parametrize(
    "args, options, fragment",
    [
        (("x +* 2", "Broken"), {}, "invalid syntax"),
        (("x", "lower"), {}, "upper-case letter"),
        (("x", "Colour"), {"colour": "red"}, "unknown option 'colour'"),
        (("log(x)", "Log"), {"domain": {"x": (-1, 2)}}, "not real and finite"),
    ],
)
def test_bad_input_raises_and_loads_nothing(args, options, fragment):
    before = set(sys.modules)
    with pytest.raises(SymgradError, match=fragment):
        symgrad.function(*args, **options)
    assert set(sys.modules) - before == set()
