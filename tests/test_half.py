"""The float16 widening decision (symgrad.math.half): a body computes in float32 only where
op-by-op float16 breaks the contract; the emulation it rests on matches torch's float16."""

from __future__ import annotations

import math

import pytest
import sympy
import torch

from symgrad import generate_source
from symgrad.math.half import emulate, loses_in_float16, to_half
from test_fuzz import import_source

x, y, g = sympy.symbols("x y g", real=True)


def test_to_half_rounds_and_overflows_as_torch_does():
    for value in (1.0, 0.1, 1e-6, 1e-9, 65504.0, 65519.0, 65520.0, -7e4, 3.14159):
        assert to_half(value) == torch.tensor(value, dtype=torch.float64).half().item() or (
            math.isinf(to_half(value)) and math.isinf(torch.tensor(value).half().item())
        )


def test_emulation_matches_torch_float16_op_by_op():
    for value in (0.3, 3.0, 300.0, -1e4):
        t = torch.tensor([value], dtype=torch.float16)
        half = to_half(value)
        assert emulate(3 * x**2, {x: half}) == (3 * t**2).item()
        assert emulate(x**2 / (x + 1), {x: half}) == (t**2 / (t + 1)).item()


def test_cube_backward_overflows_op_by_op_so_it_is_widened():
    """g*3*x**2 at x = 300, g = 0.01: x**2 is inf in float16, the truth 2700 is finite."""
    x16 = torch.tensor(300.0, dtype=torch.float16)
    assert torch.isinf(0.01 * 3 * x16**2)
    assert loses_in_float16(g * 3 * x**2, [x, g], frozenset({g}))
    source = generate_source("x**3", "Cube")
    assert "grad_output, x, _ = _float32_for_half(grad_output, x)" in source
    assert "x_tangent, x, half = _float32_for_half(x_tangent, x)" in source


@pytest.mark.parametrize(("expr", "name"), [("exp(x)", "Exp"), ("2*x", "Double"), ("x**2", "Square")])
def test_bodies_that_keep_the_contract_in_float16_are_not_widened(expr, name):
    source = generate_source(expr, name)
    assert "_float32_for_half" not in source and "_round_to" not in source and "_half_of" not in source


def test_square_backward_keeps_the_contract_op_by_op():
    assert not loses_in_float16(g * 2 * x, [x, g], frozenset({g}))


def test_a_simplified_formula_that_overflows_is_widened():
    """216*x/(x**2 + 6)**3 is 0 from x = 10 op by op in float16 and nan from 303."""
    assert loses_in_float16(216 * x / (x**2 + 6) ** 3, [x])


def test_a_gradient_written_in_the_output_reads_it_rounded():
    result = sympy.Symbol("result", real=True)
    assert not loses_in_float16(g * result, [x, g], frozenset({g}), {result: sympy.exp(x)})


def test_a_denominator_is_multiplied_out_before_the_division():
    """The printer writes 2 / (x * y): x*y overflows float16 at x = y = 300, so the quotient
    is 0 where the truth is 2.2e-5, and the body is widened."""
    assert emulate(2 / (x * y), {x: 300.0, y: 300.0}) == 0.0
    x16 = torch.tensor(300.0, dtype=torch.float16)
    assert 2 / (x16 * x16) == 0
    assert loses_in_float16(2 / (x * y), [x, y])


@pytest.mark.parametrize(
    ("function", "argument", "want"),
    [(sympy.exp, -math.inf, 0.0), (sympy.exp, math.inf, math.inf), (sympy.tanh, -math.inf, -1.0), (sympy.log, math.inf, math.inf)],
)
def test_a_function_of_an_overflowed_argument_is_its_ieee_limit(function, argument, want):
    assert emulate(function(x), {x: argument}) == want


@pytest.mark.parametrize("function", [sympy.sin, sympy.cos])
def test_a_periodic_function_of_inf_is_nan(function):
    assert math.isnan(emulate(function(x), {x: math.inf}))


def test_a_body_with_no_point_to_compare_at_is_widened():
    """Where the exact value is outside float16's range at every probe point, nothing shows
    float16 keeps the contract."""
    assert loses_in_float16(sympy.exp(x**2 + 20), [x])


def test_a_saved_output_is_read_as_forward_may_have_computed_it():
    """g*result, with result = 216*x/(x**2 + 6)**3 saved: read exactly rounded, the product
    keeps the contract; as forward computes it op by op in float16 (0 from x = 10) it does
    not, so the gradient is widened."""
    result = sympy.Symbol("result", real=True)
    saved = 216 * x / (x**2 + 6) ** 3
    assert emulate(saved, {x: 10.0}) == 0.0
    assert loses_in_float16(g * result, [x, g], frozenset({g}), {result: saved})


def test_a_saved_output_the_body_does_not_read_is_not_emulated():
    result = sympy.Symbol("result", real=True)
    assert not loses_in_float16(g * 2 * x, [x, g], frozenset({g}), {result: sympy.floor(x)})


def test_negative_zero_to_an_odd_negative_power_is_minus_inf():
    assert emulate(x**-1, {x: -0.0}) == -math.inf


def test_the_emulation_multiplies_in_the_order_the_body_does():
    """An unevaluated product is computed in its arguments' order: the derivative 2*x
    first overflows at x = 6e4; the upstream 0.01 first, never."""
    last = sympy.Mul(g, 2 * x, evaluate=False)
    assert math.isinf(emulate(last, {g: to_half(0.01), x: 6e4}))
    assert emulate(g * 2 * x, {g: to_half(0.01), x: 6e4}) == to_half(to_half(0.01 * 2) * 6e4)
    assert loses_in_float16(last, [x, g], frozenset({g}))


def test_square_backward_is_finite_in_float16_where_its_gradient_is(tmp_path):
    module = import_source(generate_source("x**2", "Square"), tmp_path)
    x16 = torch.tensor([6e4, -6e4], dtype=torch.float16, requires_grad=True)
    (grad,) = torch.autograd.grad(module.square(x16), x16, torch.full((2,), 0.01, dtype=torch.float16))
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad.float(), torch.tensor([1200.0, -1200.0]), rtol=2e-3, atol=0)
