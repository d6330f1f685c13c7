"""--vjp INPUT=EXPR: a surrogate backward that uses the upstream gradient.

The two real examples of issue 44: a lower bound that passes the gradient where
``x >= bound`` or ``grad_output < 0``, and a straight-through estimator whose backward is
``clamp(grad_output, -1, 1)``. Their gradients are checked against the rule written out in
torch; double backward and jvp are refused at call time with a clear error.
"""

from __future__ import annotations

import pytest
import torch

from conftest import load_source
from symgrad.api import generate_source
from symgrad.errors import SymgradError

LOWER_BOUND = ("x", "LowerBound", {"params": ["bound"], "vjps": {"x": "where((x >= bound) | (grad_output < 0), grad_output, 0)"}})
CLAMPED_STE = ("sign(x)", "ClampedSTE", {"vjps": {"x": "clamp(grad_output, -1, 1)"}})
SCALED = ("x*y", "ScaledFirst", {"vjps": {"x": "2*grad_output*y"}})


def _load(case, directory):
    expr, name, options = case
    module = load_source(generate_source(expr, name, **options), directory / f"vjp_{name.lower()}.py")
    return getattr(module, module.__all__[1])


@pytest.fixture(scope="module")
def functions(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vjp")
    return {case[1]: _load(case, directory) for case in (LOWER_BOUND, CLAMPED_STE, SCALED)}


def test_lower_bound_passes_the_gradient_where_the_rule_says(functions):
    x = torch.tensor([-2.0, -0.5, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    upstream = torch.tensor([1.0, -1.0, 3.0, -4.0], dtype=torch.float64)
    y = functions["LowerBound"](x, 0.0)
    torch.testing.assert_close(y, x.detach())
    (grad,) = torch.autograd.grad(y, x, upstream)
    rule = torch.where((x.detach() >= 0.0) | (upstream < 0), upstream, torch.zeros_like(upstream))
    torch.testing.assert_close(grad, rule)


def test_clamped_straight_through_estimator(functions):
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    upstream = torch.linspace(-3, 3, 9, dtype=torch.float64)
    y = functions["ClampedSTE"](x)
    torch.testing.assert_close(y, torch.sign(x.detach()))
    (grad,) = torch.autograd.grad(y, x, upstream)
    torch.testing.assert_close(grad, upstream.clamp(-1, 1))


def test_an_input_without_vjp_keeps_its_true_gradient(functions):
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    gx, gy = torch.autograd.grad(functions["ScaledFirst"](x, y).sum(), (x, y))
    torch.testing.assert_close(gx, 2 * y.detach())
    torch.testing.assert_close(gy, x.detach())


def test_vmap_and_compile(functions):
    ste = functions["ClampedSTE"]
    x = torch.randn(3, 4)
    grads = torch.func.vmap(torch.func.grad(lambda v: (3 * ste(v)).sum()))(x)
    torch.testing.assert_close(grads, torch.ones_like(x))
    compiled = torch.compile(ste, fullgraph=True, backend="aot_eager")
    leaf = x.clone().requires_grad_()
    (3 * compiled(leaf)).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.ones_like(x))


def test_double_backward_differentiates_the_surrogate_as_written(functions):
    """The backward is differentiable torch code: double backward is its derivative (the
    surrogate's, not the function's; docs/usage.md says so)."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(functions["ScaledFirst"](x, y).sum(), x, create_graph=True)
    (gy,) = torch.autograd.grad(gx.sum(), y)
    torch.testing.assert_close(gy, torch.full_like(gy, 2.0))


def test_jvp_is_refused_at_call_time(functions):
    ste = functions["ClampedSTE"]
    x = torch.randn(4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="forward-mode AD .* --vjp surrogate"):
        torch.func.jvp(ste, (x,), (torch.ones(4, dtype=torch.float64),))


def test_the_module_says_it_is_a_surrogate():
    source = generate_source(*CLAMPED_STE[:2], **CLAMPED_STE[2])
    assert "(surrogate, --vjp)" in source and "NOT the true derivative" in source
    assert '"vjps": [["x", "clamp(grad_output, -1, 1)"]]' in source.splitlines()[2]  # the recorded spec


@pytest.mark.parametrize(
    "expr, options, message",
    [
        ("x", {"vjps": {"y": "grad_output"}}, "'y' is not a differentiable input"),
        ("x*y", {"vjps": {"x": "grad_output*z"}}, "'z' is not an input, a param or grad_output"),
        ("x", {"vjps": {"x": "grad_output"}, "grads": {"x": "1"}}, "give one"),
        ("x, 2*x", {"vjps": {"x": "grad_output"}}, "needs a single output"),
        ("x", {"vjps": {"x": "grad_output"}, "fuse": True}, "cannot be combined with --fuse"),
        ("x", {"vjps": {"x": "(grad_output, 1)"}}, "must be a single expression"),
        ("x", {"vjps": {"x": "grad_output +* 2"}}, "invalid syntax"),
        # (the --vjp planner has no --grad: it would keep y's true gradient silently)
        ("x*y", {"vjps": {"x": "grad_output"}, "grads": {"y": "1"}}, "--grad cannot be combined with --vjp"),
    ],
)
def test_bad_vjp_is_refused(expr, options, message):
    with pytest.raises(SymgradError, match=message):
        generate_source(expr, "Bad", **options)


def test_cli_vjp_writes_the_module_and_records_the_command(cli):
    code, out, err = cli("sign(x)", "--name", "ClampedSTE", "--vjp", "x=clamp(grad_output, -1, 1)")
    assert code == 0, err
    from pathlib import Path

    text = Path("generated/clamped_ste.py").read_text()
    assert "--vjp 'x=clamp(grad_output, -1, 1)'" in text.splitlines()[1]
    code, _, err = cli("sign(x)", "--name", "Broken", "--vjp", "x")
    assert code == 2 and err.startswith("symgrad: error: --vjp 'x': expected NAME=EXPR")
    assert not Path("generated/broken.py").exists()


def test_pyproject_vjp_key(tmp_path):
    from symgrad.cli.config import load_targets

    config = tmp_path / "pyproject.toml"
    config.write_text(
        '[tool.symgrad]\n[[tool.symgrad.functions]]\nname = "ClampedSTE"\nexpr = "sign(x)"\n'
        'vjp = { x = "clamp(grad_output, -1, 1)" }\n'
    )
    (target,) = load_targets(config)
    assert target.spec.vjps == (("x", "clamp(grad_output, -1, 1)"),)
    config.write_text('[tool.symgrad]\n[[tool.symgrad.functions]]\nname = "A"\nexpr = "x"\nvjp = { x = 1 }\n')
    with pytest.raises(SymgradError, match="'vjp' must be a table of expressions"):
        load_targets(config)


@pytest.mark.parametrize("grad, want", [("1", 1.0), ("k", 0.25)])
def test_a_gradient_of_numbers_and_params_alone(grad, want, tmp_path):
    """--vjp x=1 (or a number param): a tensor of the input's shape, not a number."""
    source = generate_source("sign(x)", "Flat", params=["k"] if grad == "k" else [], vjps={"x": grad})
    module = load_source(source, tmp_path / "vjp_flat.py")
    x = torch.randn(3, 4, requires_grad=True)
    args = (x, 0.25) if grad == "k" else (x,)
    module.flat(*args).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3, 4), want))
