"""The helper functions generated modules carry (symgrad.runtime.helpers), tested as code,
and their copies (printer.HELPERS) checked to be exactly that code."""

from __future__ import annotations

import ast
import inspect
import types

import pytest
import torch

from symgrad.codegen.printer import HELPERS
from symgrad.runtime import helpers as h


def test_helpers_are_the_runtime_functions_source():
    """HELPERS holds every function of the runtime module, each its exact source lines, and
    each copy runs standalone beside ``torch`` and the other helpers (as in a module)."""
    functions = {name: f for name, f in vars(h).items() if isinstance(f, types.FunctionType)}
    assert set(HELPERS) == set(functions)
    for name, source in HELPERS.items():
        assert "\n".join(source) + "\n" == inspect.getsource(functions[name]), name
        tree = ast.parse("\n".join(source))
        assert [node.name for node in tree.body] == [name]
    namespace = {"torch": torch}
    for source in HELPERS.values():
        exec("\n".join(source), namespace)  # noqa: S102 - our own helpers
    assert namespace["_round_to"](torch.float16, torch.ones(2)).dtype == torch.float16


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_each_helper_has_a_one_line_docstring(name):
    """A generated module gets the one line; the reasons stay in this package, as the
    comment above each function."""
    (function,) = ast.parse("\n".join(HELPERS[name])).body
    docstring = ast.get_docstring(function, clean=False)
    assert docstring and "\n" not in docstring, name
    assert HELPERS[name][1].strip() == f'"""{docstring}"""'


def test_sigmoid_eager_and_cpu_is_torch_sigmoid():
    u = torch.linspace(-60, 60, 101, dtype=torch.float32)
    assert torch.equal(h._sigmoid(u), torch.sigmoid(u))


def test_floating():
    integers = torch.tensor([1, -2])
    assert h._floating(integers).dtype == torch.get_default_dtype()
    assert torch.equal(h._floating(integers), torch.tensor([1.0, -2.0]))
    halves = torch.tensor([0.5], dtype=torch.float16)
    assert h._floating(halves) is halves
    assert h._floating(torch.tensor([True])).dtype == torch.get_default_dtype()


@pytest.mark.parametrize(("helper", "function"), [(h._erfcx, torch.special.erfcx), (h._log_ndtr, torch.special.log_ndtr)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_helpers_compute_in_float32(helper, function, dtype):
    u = torch.tensor([-3.0, -0.5, 0.0, 2.0, 8.0], dtype=dtype)
    result = helper(u)
    assert result.dtype == dtype
    assert torch.equal(result, function(u.float()).to(dtype))
    wide = torch.tensor([-3.0, 0.25, 8.0], dtype=torch.float64)
    assert torch.equal(helper(wide), function(wide))


def test_float32_for_half_leaves_other_dtypes_alone():
    x, y = torch.ones(3), torch.ones(3, dtype=torch.float64)
    assert h._float32_for_half(x, y, 2.0) == (x, y, 2.0, None)
    # float16 beside a float64 tensor is not a float16 result: nothing converts
    half = torch.ones(3, dtype=torch.float16)
    *values, decided = h._float32_for_half(half, y)
    assert decided is None and values[0] is half


def test_float32_for_half_widens_float16():
    x = torch.tensor([1.5, 2.0], dtype=torch.float16)
    param = torch.tensor(0.5)  # a 0-d float32 param takes the activations' dtype
    wide_x, wide_param, number, half = h._float32_for_half(x, param, 3)
    assert half == torch.float16
    assert wide_x.dtype == torch.float32 and torch.equal(wide_x, x.float())
    assert wide_param is param and number == 3


def test_float32_for_half_also():
    """``also``: another output's decision was float16, so float16 tensors widen here too."""
    x, y = torch.ones(2, dtype=torch.float16), torch.ones(2)
    *_, half = h._float32_for_half(x, y)
    assert half is None
    wide_x, wide_y, half = h._float32_for_half(x, y, also=(torch.float16,))
    assert half is None and wide_x.dtype == torch.float32 and wide_y is y


def test_half_of():
    half = torch.ones(2, dtype=torch.float16)
    assert h._half_of(half, torch.tensor(1.0)) == torch.float16
    assert h._half_of(half, torch.ones(2)) is None
    assert h._half_of(torch.tensor(1.0, dtype=torch.float16)) == torch.float16
    assert h._half_of(torch.tensor([1, 2]), 2.0) is None
    assert h._half_of() is None


def test_dtype_with_follows_type_promotion():
    integers, flags = torch.tensor([1, 2]), torch.tensor([True])
    assert h._dtype_with(torch.ones(1, dtype=torch.float64), 0.5) == torch.float64
    assert h._dtype_with(integers, 0.5) == torch.get_default_dtype()
    assert h._dtype_with(integers, 2) == torch.int64
    assert h._dtype_with(integers, torch.tensor(1.0, dtype=torch.float64)) == torch.float64
    assert h._dtype_with(flags, 2) == torch.int64
    assert h._dtype_with(flags, True) == torch.bool
    for reference, value in [(integers, 0.5), (integers, 2), (flags, 2), (flags, True)]:
        assert h._dtype_with(reference, value) == torch.result_type(reference, value)


def test_overwrite_copies_and_reports_shared_kept_tensors():
    target = torch.tensor([1.0, 2.0])
    alias, other = target[:], torch.tensor([5.0, 6.0])
    changed = h._overwrite(target, torch.tensor([3.0, 4.0]), a=alias, b=other, n=None)
    assert torch.equal(target, torch.tensor([3.0, 4.0]))
    assert changed == ("a",)


def test_overwrite_refuses_a_narrowing_write():
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        h._overwrite(torch.tensor([1, 2]), torch.tensor([1.5, 2.5]))
    with pytest.raises(RuntimeError, match="can't be cast"):
        h._overwrite(torch.tensor([True]), torch.tensor([1]))
    target = torch.tensor([1.0])
    h._overwrite(target, torch.tensor([2]))  # an integer result fits a float target
    assert torch.equal(target, torch.tensor([2.0]))


def test_refuse_overwritten():
    ctx = types.SimpleNamespace(overwritten=("a",), needs_input_grad=(False, True))
    h._refuse_overwritten(ctx, a=(0,))  # no wanted gradient reads it
    with pytest.raises(RuntimeError, match=r"a shares memory .* pass a copy \(a.clone\(\)\)"):
        h._refuse_overwritten(ctx, a=(0, 1))


def test_reduced_to():
    tangent = torch.ones(2, 3)
    assert torch.equal(h._reduced_to(tangent, (1, 3)), torch.full((1, 3), 2.0))
    assert torch.equal(h._reduced_to(torch.ones(3), (2, 3)), torch.ones(2, 3))  # broadcast first
    assert h._reduced_to(tangent, ()).item() == 6.0


def test_gather_last_checks_the_index_shape():
    values = torch.arange(12.0).reshape(2, 2, 3)
    index = torch.tensor([[0, 2], [1, 1]])
    assert torch.equal(h._gather_last(values, index), torch.tensor([[[0.0], [5.0]], [[7.0], [10.0]]]))
    for wrong in (torch.tensor([0, 2]), index.unsqueeze(-1), 2):
        with pytest.raises(ValueError, match=r"must be an integer tensor of shape \(2, 2\)"):
            h._gather_last(values, wrong)


def test_scatter_added_adds_in_place_and_out_of_place_where_vmap_refuses():
    index = torch.tensor([[1], [0]])
    fresh = torch.zeros(2, 3)
    added = h._scatter_added(fresh, index, torch.ones(2, 1))
    assert added is fresh and torch.equal(added, torch.tensor([[0.0, 1, 0], [1, 0, 0]]))
    # (targets vmapped, the base shared: the in-place add raises, and nothing is written)
    shared = torch.zeros(2, 3)
    batched = torch.func.vmap(lambda i: h._scatter_added(shared, i, torch.ones(2, 1)))(torch.stack([index, 1 - index]))
    assert torch.equal(shared, torch.zeros(2, 3))
    assert torch.equal(batched[1], torch.tensor([[1.0, 0, 0], [0, 1, 0]]))


def test_scatter_added_scales_and_shifts_in_place_but_not_what_autograd_reads():
    index, values = torch.tensor([[2], [0]]), torch.ones(2, 1)
    want = torch.tensor([[1.0, 1, 2], [2, 1, 1]])
    base = torch.ones(2, 3)
    with torch.no_grad():  # (as first-order backward runs)
        added = h._scatter_added(base, index, values, scale=torch.tensor(2.0), shift=-1)
    assert added is base and torch.equal(added, want)
    # (under grad mode the softmax's output is what its backward reads: left as it is)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    softmax = torch.softmax(x, -1)
    kept = softmax.detach().clone()
    added = h._scatter_added(softmax, index, values.double(), scale=2.0)
    assert torch.equal(softmax, kept) and torch.allclose(added, 2 * kept + torch.tensor([[0.0, 0, 1], [1, 0, 0]]))
    added.sum().backward()


def test_round_to():
    x, n = torch.tensor([1.0 / 3.0]), torch.tensor([2])
    assert h._round_to(None, x) is x
    assert h._round_to(None, x, n) == (x, n)
    rounded, kept = h._round_to(torch.float16, x, n)
    assert rounded.dtype == torch.float16 and kept is n
    assert h._round_to(torch.float16, 2.0) == 2.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logsumexp_is_torchs_eager_and_compiled_at_any_scale(dtype):
    """_logsumexp keeps torch.logsumexp's values where the one-pass sum is taken (moderate
    rows), where it is not (logits of 1e4 overflow it, rows all near -200 underflow it), and
    for a dtype that never takes it."""
    torch.manual_seed(0)
    x = torch.randn(4, 33, dtype=torch.float64)
    compiled = torch.compile(h._logsumexp, fullgraph=True)
    for values in (x, 1e4 * x, x - 200, x - 30, x + 60):
        u = values.to(dtype)
        want = torch.logsumexp(u, -1, keepdim=True)
        assert torch.equal(h._logsumexp(u, -1), want)  # (eager: torch's own)
        got = compiled(u, -1)
        assert got.dtype == dtype and torch.isfinite(got).all()
        rtol = {torch.float32: 2e-6, torch.float64: 1e-14, torch.bfloat16: 1e-2}[dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=0)
    torch.testing.assert_close(compiled(x, (0, 1)), torch.logsumexp(x, (0, 1), keepdim=True))


def test_row_constant_refuses_a_param_that_varies_along_the_row():
    for fine in (0.5, torch.tensor(2.0), torch.ones(3, 1), torch.ones(1)):
        h._row_constant(fine, "s", (-1,))
    with pytest.raises(ValueError, match=r"s has shape \(3, 4\)"):
        h._row_constant(torch.ones(3, 4), "s", (-1,))
    with pytest.raises(ValueError, match="s has shape"):
        h._row_constant(torch.ones(4), "s", (0,))  # (a front dim: only a single value is sure)
