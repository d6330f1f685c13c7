"""The torch-style spellings users type (where, relu, clamp, round, max/min, & | ~ in
conditions): each generates a module that passes gradcheck and gradgradcheck in float64, and
the precedence pitfall ``x > 0 & x < 1`` is refused in one line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch
from test_fuzz import import_source

from symgrad import generate_source

# (expression, --grad surrogates, input values away from each kink and jump)
CASES = {
    "TorchWhere": ("where(x > 0, x, 0.1*x)", {}, {"x": [-2.0, -0.3, 0.4, 1.7]}),
    "TorchRelu": ("relu(x)", {}, {"x": [-2.0, -0.3, 0.4, 1.7]}),
    "TorchClamp": ("clamp(x, -1, 1)", {}, {"x": [-2.0, -0.3, 0.4, 1.7]}),
    "TorchClampBy": ("clamp(x, y - 1, y**2 + 1)", {}, {"x": [-2.0, 0.2, 0.9, 3.0], "y": [0.5, -0.4, 0.3, 0.7]}),
    "TorchMax": ("max(x, y, 0)", {}, {"x": [-2.0, 0.5, 1.7, -0.1], "y": [-1.0, 0.2, 0.3, 0.9]}),
    "TorchMin": ("min(x, y, 1)", {}, {"x": [-2.0, 0.5, 1.7, 1.5], "y": [-1.0, 0.2, 0.3, 2.0]}),
    "TorchRound": ("round(x)", {"x": "1"}, {"x": [-2.2, -0.3, 0.4, 1.7]}),
    "TorchRoundTimes": ("x*round(x)", {}, {"x": [-2.2, -0.3, 0.6, 1.7]}),
    "TorchAndOr": (
        "Piecewise((x**2, (x > 0) & (x < 1)), (sin(x), (x < -1) | ~(x < 2)), (x, True))",
        {},
        {"x": [-2.0, -0.5, 0.5, 1.5, 2.5]},
    ),
    "TorchWhereAnd": ("where((x > 0) & (y > 0), x*y, x + y)", {}, {"x": [-1.0, 0.5, 0.7], "y": [0.3, 0.2, -0.6]}),
}


def _generated(name: str, tmp_path):
    expr, grads, values = CASES[name]
    module = import_source(generate_source(expr, name, grads=grads or None), tmp_path)
    inputs = tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values.values())
    return getattr(module, name), inputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_module_passes_gradcheck_and_gradgradcheck(name, tmp_path):
    function, inputs = _generated(name, tmp_path)
    if name == "TorchRound":
        # The straight-through surrogate is not the derivative of round, so finite differences
        # (0) cannot check it: check it as given, and its backward's own derivatives.
        upstream = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        (grad,) = torch.autograd.grad(function.apply(*inputs), inputs, upstream)
        torch.testing.assert_close(grad, upstream)
        assert torch.autograd.gradgradcheck(function.apply, inputs)
        return
    assert torch.autograd.gradcheck(function.apply, inputs)
    assert torch.autograd.gradgradcheck(function.apply, inputs)


def test_round_is_torch_round_half_to_even(tmp_path):
    function, _ = _generated("TorchRound", tmp_path)
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999, 2.7], dtype=torch.float64)
    torch.testing.assert_close(function.apply(x), torch.round(x))
    assert function.apply(x).tolist() == [-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 2.0, 3.0]
    assert "torch.round(" in generate_source("round(x)", "TorchRound", grads={"x": "1"})


def test_forward_values_match_torch(tmp_path):
    x = torch.linspace(-3, 3, 61, dtype=torch.float64)
    y = torch.linspace(2, -1, 61, dtype=torch.float64)
    expected = {
        "TorchWhere": torch.where(x > 0, x, 0.1 * x),
        "TorchRelu": torch.relu(x),
        "TorchClamp": torch.clamp(x, -1, 1),
        "TorchMax": torch.clamp(torch.maximum(x, y), min=0),
        "TorchWhereAnd": torch.where((x > 0) & (y > 0), x * y, x + y),
    }
    for name, want in expected.items():
        function, inputs = _generated(name, tmp_path)
        args = (x, y)[: len(inputs)]
        torch.testing.assert_close(function.apply(*args), want)


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("x > 0 & x < 1", "put each comparison in parentheses: (x > 0) & (x < 1)"),
        ("Piecewise((x, x < -1 | x > 1), (0, True))", "(x < -1) | (x > 1)"),
        ("where(x > 0 & x < 1 | x > 2, x, 0)", "(x > 0) & (x < 1) | (x > 2)"),
        ("x & y", "the & operator is only allowed between comparisons"),
        ("x*(x > 0) | (x < 1)", "the | operator is only allowed"),
        ("~x", "the ~ operator is only allowed"),
        ("where(x, x, 0)", "a Piecewise condition must be a comparison"),
        ("where(x > 0, x)", "where() takes 3 arguments, got 2"),
        ("clamp(x, 1)", "clamp() takes 3 arguments, got 2"),
        ("relu(x, y)", "relu() takes 1 argument, got 2"),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(cli, tmp_path, expr, fragment):
    code, out, err = cli(expr, "--name", "Refused")
    assert code == 2, err
    assert fragment in err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.rglob("*.py"))
