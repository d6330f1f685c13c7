"""Row-wise modules (reductions along a dim, softmax, gather): the contract every generated
module keeps, against torch's own functions.

Each case is a textbook formula with its torch reference; the module is generated into a
temporary folder and checked: values against the reference (float64), gradcheck and
gradgradcheck, forward AD, vmap against a loop (over a new leading dim too), jacfwd ==
jacrev, torch.compile(fullgraph=True) through the alias, and float32/float16/bfloat16 values.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from conftest import load_source
from rowwise_reference import mp_eval
from symgrad.api import generate_source
from symgrad.errors import SymgradError
from symgrad.naming import snake_case

from conftest import rowwise_generated_names


@dataclass(frozen=True)
class Case:
    name: str
    expr: str
    reference: Callable
    inputs: tuple[str, ...] = ("x",)
    params: tuple[str, ...] = ()
    shapes: dict = field(default_factory=dict)  # input -> shape (default (4, 6))
    values: dict = field(default_factory=dict)  # param -> value (a number, or a tensor maker)
    saved_full: int = 1  # full-size tensors backward may save


def _targets():
    return torch.tensor([1, 0, 5, 2])


CASES = [
    Case("Softmax", "exp(x)/sum(exp(x), -1)", lambda x: torch.softmax(x, -1)),
    Case("LogSoftmax", "x - log(sum(exp(x), -1))", lambda x: torch.log_softmax(x, -1)),
    Case("LogSumExp", "log(sum(exp(x), -1))", lambda x: torch.logsumexp(x, -1)),
    Case(
        "RMSNorm",
        "x/sqrt(mean(x**2, -1) + eps)*w",
        lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        inputs=("x", "w"),
        params=("eps",),
        shapes={"w": (6,)},
        values={"eps": 1e-6},
    ),
    Case(
        "CrossEntropy",
        "mean(-gather(log_softmax(x, -1), t))",
        lambda x, t: F.cross_entropy(x, t),
        params=("t",),
        values={"t": _targets},
    ),
    Case(
        "CosineSimilarity",
        "sum(x*y, -1)/sqrt(sum(x**2, -1)*sum(y**2, -1))",
        lambda x, y: F.cosine_similarity(x, y, dim=-1, eps=0.0),
        inputs=("x", "y"),
        saved_full=2,
    ),
    Case("L2Normalize", "x/norm(x, -1)", lambda x: F.normalize(x, dim=-1, eps=0.0)),
    Case(
        "Entropy",
        "-sum(softmax(x, -1)*log_softmax(x, -1), -1)",
        lambda x: torch.distributions.Categorical(logits=x).entropy(),
    ),
    Case(
        "LayerNorm",
        "(x - mean(x, -1))/sqrt(mean((x - mean(x, -1))**2, -1) + eps)*w + b",
        lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        inputs=("x", "w", "b"),
        params=("eps",),
        shapes={"w": (6,), "b": (6,)},
        values={"eps": 1e-5},
    ),
    Case(
        "LabelSmoothedCrossEntropy",
        "mean(-(1 - s)*gather(log_softmax(x, -1), t) - s*mean(log_softmax(x, -1), -1))",
        lambda x, t, s: F.cross_entropy(x, t, label_smoothing=s),
        params=("t", "s"),
        values={"t": _targets, "s": 0.1},
    ),
    Case(
        "ScaledCrossEntropy",  # (the gather's operand has neither input's shape: w is (H,))
        "mean(-gather(log_softmax(x*w, -1), t))",
        lambda x, w, t: F.cross_entropy(x * w, t),
        inputs=("x", "w"),
        params=("t",),
        shapes={"w": (6,)},
        values={"t": _targets},
    ),
    Case("SwiGLU", "chunk(x, 2, 0)*sigmoid(chunk(x, 2, 0))*chunk(x, 2, 1)", lambda x: F.silu(x[..., :3]) * x[..., 3:]),
    Case(
        "RowCrossEntropy",
        "-gather(log_softmax(x, -1), t)",
        lambda x, t: F.cross_entropy(x, t, reduction="none"),
        params=("t",),
        values={"t": _targets},
    ),
    Case(
        "TextbookEntropy",
        "-sum(exp(x)/sum(exp(x), -1)*log(exp(x)/sum(exp(x), -1)), -1)",
        lambda x: torch.distributions.Categorical(logits=x).entropy(),
    ),
    Case("RowMax", "amax(x, -1)", lambda x: torch.amax(x, -1)),
    Case("SumSquares", "sum(x**2)", lambda x: (x**2).sum()),
    # shapes: reductions meeting whole-tensor ones, tuple dims, a positive dim
    Case("RowSums", "sum(x, -1)", lambda x: x.sum(-1)),
    # a mean's gradient reads x's shape alone: backward saves the shape, as MeanBackward does
    Case("RowMeans", "mean(x, -1)", lambda x: x.mean(-1), saved_full=0),
    Case("CenteredRows", "x - mean(x, -1)", lambda x: x - x.mean(-1, keepdim=True), saved_full=0),
    Case("RowsTimesMean", "sum(x, -1)*mean(x)", lambda x: x.sum(-1) * x.mean()),
    Case("MeanOfRowMax", "mean(amin(x, -1))", lambda x: torch.amin(x, -1).mean()),
    Case("Centered", "x - mean(x, (-2, -1))", lambda x: x - x.mean((-2, -1), keepdim=True), shapes={"x": (2, 3, 4)}),
    Case("ColumnSoftmax", "softmax(x, 0)", lambda x: torch.softmax(x, 0)),
    Case("ColumnNorms", "norm(x, 0)", lambda x: torch.linalg.vector_norm(x, dim=0)),
    Case("Normalized", "x/sum(x)", lambda x: x / x.sum(), shapes={"x": (3, 4)}),
]


def _load(case: Case, directory):
    """The module in generated/ where [tool.symgrad] has this case, else one generated here."""
    if snake_case(case.name) in rowwise_generated_names():
        module = importlib.import_module(f"generated.{snake_case(case.name)}")
        if module.__symgrad__["expr"] == case.expr:
            return module
    return _module_of(generate_source(case.expr, case.name, inputs=case.inputs, params=case.params), case.name, directory)


def _module_of(source: str, name: str, directory):
    """``source`` written to ``directory`` and imported, as a module of its own."""
    return load_source(source, directory / f"rowwise_{name.lower()}.py")


def _args(case: Case, dtype=torch.float64, requires_grad=True):
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for name in case.inputs:
        shape = case.shapes.get(name, (4, 6))
        value = torch.randn(shape, generator=generator, dtype=torch.float64)
        if name == "x" and case.name == "Normalized":
            value = value.abs() + 1  # (a sum far from 0)
        tensors.append(value.to(dtype).requires_grad_(requires_grad))
    params = [case.values[p]() if callable(case.values[p]) else case.values[p] for p in case.params]
    return tensors, params


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rowwise")
    return {case.name: _load(case, directory) for case in CASES}


def _alias(module):
    return getattr(module, module.__all__[1])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_values_match_torch(case, modules):
    tensors, params = _args(case)
    got = _alias(modules[case.name])(*tensors, *params)
    want = case.reference(*tensors, *params)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_torch(case, modules):
    tensors, params = _args(case)
    got = _alias(modules[case.name])(*tensors, *params)
    upstream = torch.randn_like(got)
    mine = torch.autograd.grad(got, tensors, upstream)
    theirs = torch.autograd.grad(case.reference(*tensors, *params), tensors, upstream)
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradcheck_and_gradgradcheck(case, modules):
    tensors, params = _args(case)
    function = lambda *xs: _alias(modules[case.name])(*xs, *params)  # noqa: E731
    assert torch.autograd.gradcheck(function, tensors)
    assert torch.autograd.gradgradcheck(function, tensors)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_ad(case, modules):
    tensors, params = _args(case)
    function = lambda *xs: _alias(modules[case.name])(*xs, *params)  # noqa: E731
    assert torch.autograd.gradcheck(
        function, tensors, check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_jacfwd_equals_jacrev(case, modules):
    tensors, params = _args(case, requires_grad=False)
    function = lambda *xs: _alias(modules[case.name])(*xs, *params)  # noqa: E731
    argnums = tuple(range(len(tensors)))
    forward = torch.func.jacfwd(function, argnums=argnums)(*tensors)
    reverse = torch.func.jacrev(function, argnums=argnums)(*tensors)
    for a, b in zip(forward, reverse):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_vmap_matches_a_loop(case, modules):
    tensors, params = _args(case, requires_grad=False)
    function = lambda *xs: _alias(modules[case.name])(*xs, *params)  # noqa: E731
    # over the leading dim of the first input, and over a new leading dim of all of them
    batched = [torch.stack([t, 2 * t]) for t in tensors]
    got = torch.func.vmap(function)(*batched)
    want = torch.stack([function(*[b[k] for b in batched]) for k in range(2)])
    torch.testing.assert_close(got, want)
    grads = torch.func.vmap(torch.func.grad(lambda *xs: function(*xs).sum()))(*batched)
    loop = torch.stack([torch.func.grad(lambda *xs: function(*xs).sum())(*[b[k] for b in batched]) for k in range(2)])
    torch.testing.assert_close(grads, loop)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compiles_fullgraph(case, modules):
    torch._dynamo.reset()
    tensors, params = _args(case, dtype=torch.float32)
    alias = _alias(modules[case.name])
    compiled = torch.compile(lambda *xs: alias(*xs, *params), fullgraph=True, backend="aot_eager")
    got = compiled(*tensors)
    torch.testing.assert_close(got, alias(*tensors, *params))
    got.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_low_precision_dtypes(case, modules, dtype):
    tensors, params = _args(case, dtype=dtype)
    got = _alias(modules[case.name])(*tensors, *params)
    assert got.dtype == dtype
    want = case.reference(*[t.double() for t in tensors], *params)
    tolerance = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)
    got.sum().backward()
    assert all(t.grad.dtype == dtype and torch.isfinite(t.grad).all() for t in tensors)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_saves_at_most_one_full_tensor_plus_row_values(case, modules):
    tensors, params = _args(case)
    full = tensors[0].numel()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _alias(modules[case.name])(*tensors, *params)
    sizes = sorted(t.numel() for t in saved)
    assert sum(1 for s in sizes if s >= full) <= case.saved_full, sizes


@pytest.mark.parametrize(
    "expr, message",
    [
        ("softmax(x, (-2, -1))", "takes one dim"),
        ("sum(x, 1.5)", "must be an int"),
        ("sum(x, ())", "empty tuple"),
        ("sum(x, (-1, -1))", "names a dim twice"),
        ("sum(x, (0, -1))", "mixes negative"),
        ("sum(x, 100)", "out of range"),
        ("gather(x, 2*t)", "by its name"),
        ("softmax(x)", "takes 2 arguments"),
    ],
)
def test_bad_row_functions_are_refused(expr, message):
    with pytest.raises(SymgradError, match=message):
        generate_source(expr, "Bad")


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax", "LogSumExp", "CrossEntropy", "TextbookEntropy"])
def test_textbook_formulas_are_exact_at_any_logit_scale(name, modules):
    """exp(x)/sum(exp(x)) and log(sum(exp(x))) become torch's max-shifted kernels: finite and
    equal to torch's own at logits of 1e4, where the textbook formula overflows."""
    case = next(c for c in CASES if c.name == name)
    tensors, params = _args(case, dtype=torch.float32)
    scaled = [(1e4 * t.detach()).requires_grad_() for t in tensors]
    got = _alias(modules[name])(*scaled, *params)
    torch.testing.assert_close(got, case.reference(*scaled, *params), rtol=1e-5, atol=1e-3)
    got.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in scaled)


def test_a_chunk_count_that_does_not_divide_is_refused_at_call_time(modules):
    with pytest.raises(RuntimeError, match="unflatten"):
        _alias(modules["SwiGLU"])(torch.randn(2, 5))


def test_every_rowwise_module_in_generated_is_a_case():
    """Each row-wise module in generated/ runs this file's contract (as a case of CASES)."""
    cased = {snake_case(c.name): c.expr for c in CASES}
    for name in rowwise_generated_names():
        module = importlib.import_module(f"generated.{name}")
        assert cased.get(name) == module.__symgrad__["expr"], name


# --fuse: the same contract with the bodies compiled (every size: _EAGER_WORK_LIMIT = 0). Each
# case compiles three bodies (10-30 s on 2 cores): two run in the default tier, all under `slow`.
FUSED_DEFAULT = ("Softmax", "RMSNorm")


@pytest.fixture(scope="module")
def fused_modules(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rowwise_fused")
    loaded = {}
    for case in CASES:
        source = generate_source(case.expr, case.name + "Fused", inputs=case.inputs, params=case.params, fuse=True)
        module = load_source(source, directory / f"rowwise_fused_{case.name.lower()}.py")
        module._EAGER_WORK_LIMIT = 0  # (compile at the tests' small sizes too)
        loaded[case.name] = module
    return loaded


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c.name in FUSED_DEFAULT else pytest.mark.slow) for c in CASES],
    ids=lambda c: c.name,
)
def test_fused_modules_keep_the_contract(case, fused_modules):
    module = fused_modules[case.name]
    assert module._COMPILED is not None and "_fused(" in module.__loader__.get_source(module.__name__)
    alias = _alias(module)
    tensors, params = _args(case, dtype=torch.float32)
    got = alias(*tensors, *params)
    torch.testing.assert_close(got, case.reference(*tensors, *params), rtol=1e-5, atol=1e-5)
    upstream = torch.randn_like(got)
    mine = torch.autograd.grad(got, tensors, upstream)
    theirs = torch.autograd.grad(case.reference(*tensors, *params), tensors, upstream)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert module._COMPILED, "no body ran compiled"
    tensors64, _ = _args(case)
    function = lambda *xs: alias(*xs, *params)  # noqa: E731
    assert torch.autograd.gradcheck(function, tensors64)
    assert torch.autograd.gradgradcheck(function, tensors64)
    assert torch.autograd.gradcheck(
        function, tensors64, check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False
    )



@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if n == "CrossEntropy" else pytest.mark.slow)
        for n in ("Softmax", "LogSoftmax", "LogSumExp", "CrossEntropy", "LabelSmoothedCrossEntropy", "TextbookEntropy")
    ],
)
def test_fused_bodies_are_exact_at_any_logit_scale(name, fused_modules):
    """--fuse's compiled bodies (softmax through torch's kernel, the saved row logsumexp,
    the one-hot gradient of a gather) stay finite and equal to torch's own at logits of 1e4."""
    case = next(c for c in CASES if c.name == name)
    tensors, params = _args(case, dtype=torch.float32)
    scaled = [(1e4 * t.detach()).requires_grad_() for t in tensors]
    module = fused_modules[name]
    got = _alias(module)(*scaled, *params)
    torch.testing.assert_close(got, case.reference(*scaled, *params), rtol=1e-5, atol=1e-3)
    upstream = torch.rand_like(got) + 0.5
    mine = torch.autograd.grad(got, scaled, upstream)
    theirs = torch.autograd.grad(case.reference(*scaled, *params), scaled, upstream)
    assert module._COMPILED, "no body ran compiled"
    for a, b in zip(mine, theirs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if n == "CrossEntropy" else pytest.mark.slow)
        for n in ("CrossEntropy", "LabelSmoothedCrossEntropy", "LogSumExp", "Entropy", "TextbookEntropy")
    ],
)
def test_fused_modules_save_one_full_tensor_plus_row_values(name, fused_modules):
    """--fuse's backward reads the row's logsumexp saved from forward (or the output, where
    that is the logsumexp), and entropy's the row's sum(p*log p) too: still one full tensor,
    and values per row beside it."""
    case = next(c for c in CASES if c.name == name)
    tensors, params = _args(case)
    full, rows = tensors[0].numel(), tensors[0].numel() // tensors[0].shape[-1]
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _alias(fused_modules[name])(*tensors, *params)
    given = {p.data_ptr() for p in params if isinstance(p, torch.Tensor)}
    computed = [t for t in saved if t.numel() < full and t.data_ptr() not in given]
    assert sum(1 for t in saved if t.numel() >= full) <= case.saved_full
    expected = 2 if name in ("Entropy", "TextbookEntropy") else 1
    assert len(computed) == expected and all(t.numel() == rows for t in computed), [t.shape for t in saved]

# -- forward values against an independent mpmath evaluation ---------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_values_match_mpmath(case, modules):
    import mpmath
    import numpy as np

    from symgrad.frontend.parse import parse_spec
    from symgrad.plan.rowwise import forward_outputs
    from symgrad.spec import Spec

    parsed = parse_spec(Spec(expr=case.expr, name=case.name, inputs=case.inputs, params=case.params))
    (formula,) = forward_outputs(parsed)
    tensors, params = _args(case, requires_grad=False)
    env = {}
    with mpmath.workdps(40):
        for symbol in parsed.inputs + parsed.params:
            value = dict(zip(case.inputs, tensors)).get(symbol.name)
            if value is None:
                value = params[case.params.index(symbol.name)]
            if isinstance(value, torch.Tensor):
                convert = (lambda v: mpmath.mpf(float(v))) if value.dtype.is_floating_point else int
                flat = [convert(v) for v in value.flatten()]
                env[symbol] = np.array(flat, dtype=object).reshape(tuple(value.shape))
            else:
                env[symbol] = mpmath.mpf(value)
        exact = mp_eval(formula, env)
        want = torch.tensor(np.vectorize(float)(np.asarray(exact, dtype=object)).astype(float), dtype=torch.float64)
    got = _alias(modules[case.name])(*tensors, *params)
    torch.testing.assert_close(got, want.reshape(got.shape), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_norm_weights_of_another_shape_run_the_formula(name, modules):
    """The kernels take weights of the normalised shape; a per-row weight (B, H) runs the
    formula, with the same row values, and keeps the contract."""
    case = next(c for c in CASES if c.name == name)
    tensors, params = _args(case)
    wide = [tensors[0]] + [torch.randn(4, 6, dtype=torch.float64, requires_grad=True) for _ in tensors[1:]]
    function = lambda *xs: _alias(modules[name])(*xs, *params)  # noqa: E731
    x, w = wide[0], wide[1]
    b = wide[2] if len(wide) > 2 else 0
    if name == "LayerNorm":
        want = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + params[0]) * w + b
    else:
        want = x / torch.sqrt((x**2).mean(-1, keepdim=True) + params[0]) * w
    torch.testing.assert_close(function(*wide), want)
    assert torch.autograd.gradcheck(function, wide)
    assert torch.autograd.gradgradcheck(function, wide)


def test_a_float_class_index_is_refused_at_call_time(modules):
    """The rank and the index's dtype are known when the module runs: torch's own one-line
    errors say what is wrong (docs/limits.md, "Row-wise limits")."""
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="gather.*int64"):
        _alias(modules["CrossEntropy"])(x, torch.tensor([1.0, 0.0, 5.0, 2.0]))

@pytest.mark.parametrize(
    "index, got",
    [
        (torch.tensor([1]), "shape (1,)"),  # torch.gather would pick from row 0 only
        (torch.tensor([1, 0, 5]), "shape (3,)"),  # ... from the first three rows
        (torch.tensor([[1], [0], [5], [2]]), "shape (4, 1)"),
        (torch.tensor(1), "shape ()"),
        (1, "int"),
    ],
)
def test_a_class_index_of_another_shape_is_refused_at_call_time(index, got, modules):
    """gather's index must have the values' shape without the last dim, as F.cross_entropy's
    target must: torch.gather takes a smaller index and gives a silently wrong loss."""
    x = torch.randn(4, 6, requires_grad=True)
    for name in ("CrossEntropy", "LabelSmoothedCrossEntropy"):
        extra = (0.1,) if name == "LabelSmoothedCrossEntropy" else ()
        message = rf"gather: the class index has {re.escape(got)}; it must be an integer tensor of shape \(4,\)"
        with pytest.raises(ValueError, match=message):
            _alias(modules[name])(x, index, *extra)


def test_a_dim_out_of_range_is_refused_at_call_time(tmp_path):
    module = _load(Case("ThirdDim", "sum(x, 2)", lambda x: x.sum(2)), tmp_path)
    torch.testing.assert_close(_alias(module)(torch.ones(2, 3, 4)), torch.full((2, 3), 4.0))
    with pytest.raises(IndexError, match="[Dd]imension out of range"):
        _alias(module)(torch.randn(4, 6))


# --save speed: backward also reads the softmax or log_softmax forward computed (cross-entropy's
# log-probabilities, as F.cross_entropy keeps them), where --save memory recomputes it.
SPEED_CASES = [c for c in CASES if c.name in ("CrossEntropy", "LabelSmoothedCrossEntropy", "Entropy")]


@pytest.mark.parametrize("case", SPEED_CASES, ids=lambda c: c.name)
def test_save_speed_keeps_the_log_probabilities_and_the_contract(case, tmp_path):
    source = generate_source(case.expr, case.name + "Speed", inputs=case.inputs, params=case.params, save="speed")
    path = tmp_path / f"speed_{case.name.lower()}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    assert "torch.log_softmax(x, -1)" not in source.split("def backward")[1].split("torch.is_grad_enabled()")[0]
    alias = _alias(module)
    tensors, params = _args(case)
    function = lambda *xs: alias(*xs, *params)  # noqa: E731
    torch.testing.assert_close(function(*tensors), case.reference(*tensors, *params))
    assert torch.autograd.gradcheck(function, tensors)
    assert torch.autograd.gradgradcheck(function, tensors)
    assert torch.autograd.gradcheck(function, tensors, check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False)
    batched = [torch.stack([t, 2 * t]).detach() for t in tensors]
    torch.testing.assert_close(
        torch.func.vmap(function)(*batched), torch.stack([function(*[b[k] for b in batched]) for k in range(2)])
    )


@pytest.mark.parametrize(
    "options, option",
    [({"grads": {"x": "1"}}, "--grad"), ({"inplace": True}, "--inplace")],
)
def test_options_the_rowwise_planner_lacks_are_refused(options, option):
    # (it would otherwise write a module that ignores them: the true VJP, out of place)
    with pytest.raises(SymgradError, match=f"{option} does not apply to row-wise expressions"):
        generate_source("softmax(x, -1)", "Softmax_", **options)


@pytest.mark.parametrize(
    "expr, inputs, reference",
    [
        # (the adjoint is reduced where the softmax is not)
        ("sum(log_softmax(x, -1), -1)", ("x",), lambda x: torch.log_softmax(x, -1).sum(-1)),
        ("sum(softmax(x, -1), -1)", ("x",), lambda x: torch.softmax(x, -1).sum(-1)),
        ("mean(log_softmax(x, -1))", ("x",), lambda x: torch.log_softmax(x, -1).mean()),
        # (the softmax of a (H,) input broadcast against a (B, T, H) one)
        ("log_softmax(w, -1)*x", ("x", "w"), lambda x, w: torch.log_softmax(w, -1) * x),
        ("softmax(w, -1) + x", ("x", "w"), lambda x, w: torch.softmax(w, -1) + x),
    ],
)
def test_softmax_backward_kernels_get_an_adjoint_of_the_softmax_shape(expr, inputs, reference, tmp_path):
    """ATen's _softmax_backward_data / _log_softmax_backward_data do not broadcast: given a
    grad of another shape they raise, or (log_softmax) return wrong values silently."""
    module = _load(Case("Shaped", expr, reference, inputs=inputs), tmp_path)
    shapes = {"x": (2, 3, 5), "w": (5,)}
    args = [torch.randn(shapes[name], dtype=torch.float64, requires_grad=True) for name in inputs]
    torch.testing.assert_close(_alias(module)(*args), reference(*args))
    assert torch.autograd.gradcheck(_alias(module), args)
    assert torch.autograd.gradgradcheck(_alias(module), args)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_a_tensor_eps_runs_the_formula(name, modules):
    """The kernels take eps as a float: a tensor eps, one per row in eager mode or 0-d under
    torch.compile(fullgraph=True), runs the formula and keeps the contract."""
    case = next(c for c in CASES if c.name == name)
    tensors, _ = _args(case)
    alias = _alias(modules[name])
    x = tensors[0]
    for eps in (torch.full((4, 1), 1e-3, dtype=torch.float64), torch.tensor(1e-3, dtype=torch.float64)):
        if name == "LayerNorm":
            want = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
            want = want * tensors[1] + tensors[2]
        else:
            want = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * tensors[1]
        torch.testing.assert_close(alias(*tensors, eps), want)
        assert torch.autograd.gradcheck(lambda *xs: alias(*xs, eps), tensors)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *xs: alias(*xs, torch.tensor(1e-3)), fullgraph=True, backend="aot_eager")
    floats = [t.detach().float().requires_grad_() for t in tensors]
    compiled(*floats).sum().backward()


def test_report_refuses_a_rowwise_module_with_one_line(cli):
    code, _, err = cli("report", "softmax(x, -1)", "--name", "Softmax", "--no-timing", "--no-compile")
    assert code == 2 and err.count("\n") == 1
    assert "does not cover row-wise or --vjp modules" in err


def test_norm_gradient_is_zero_on_an_all_zero_row(modules):
    """A padding row of zeros: torch's vector_norm gives it gradient 0, not 0/0."""
    case = next(c for c in CASES if c.name == "ColumnNorms")
    x = torch.randn(4, 6, dtype=torch.float64)
    x[:, 2] = 0
    x.requires_grad_()
    (grad,) = torch.autograd.grad(_alias(modules[case.name])(x).sum(), x)
    (want,) = torch.autograd.grad(case.reference(x).sum(), x)
    torch.testing.assert_close(grad, want)
    assert torch.isfinite(grad).all()


def _backward_source(module) -> str:
    import inspect

    return inspect.getsource(getattr(module, f"_{module.__all__[0]}NoJvp").backward)


@pytest.mark.parametrize("name", ["CrossEntropy", "LabelSmoothedCrossEntropy", "RowCrossEntropy"])
def test_a_log_softmax_adjoint_of_known_row_sum_is_one_softmax_and_a_scatter_add(name, modules):
    """A gather's adjoint plus values constant along the row sums to a value per row: the
    VJP is one softmax of the saved logits and an in-row scatter_add, with no log_softmax
    recomputed, no zero tensor and no backward kernel."""
    backward = _backward_source(modules[name])
    assert backward.count("torch.softmax(x, -1)") == 1 and "_scatter_added(" in backward
    for absent in ("log_softmax", "zeros_like", "_backward_data"):
        assert absent not in backward, absent


@pytest.mark.parametrize("name", ["Entropy", "TextbookEntropy"])
def test_entropy_backward_is_the_softmax_kernel_alone(name, modules):
    """-sum(p*log p): log_softmax's VJP vanishes (its adjoint, -g*p, sums to -g per row),
    and softmax's is ATen's kernel: backward saves the logits alone."""
    module = modules[name]
    assert module.__symgrad__["saved"] == ["x"]
    backward = _backward_source(module)
    assert backward.count("_softmax_backward_data") == 1 and "_log_softmax_backward_data" not in backward


def test_softmax_adjoint_constant_along_the_row_gives_zero(tmp_path):
    """sum(softmax(x, -1), -1) is 1 whatever x: its gradient is 0 (None, as the planner
    returns a gradient that is 0), read from no tensor."""
    module = _load(Case("SoftmaxSum", "sum(softmax(x, -1), -1)", lambda x: torch.softmax(x, -1).sum(-1)), tmp_path)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(_alias(module)(x).sum(), x, allow_unused=True, materialize_grads=True)
    assert torch.equal(grad, torch.zeros_like(x))
    assert "softmax" not in _backward_source(module)


def test_cross_entropy_vmapped_over_the_targets_alone(modules):
    """The in-place scatter_add falls back to out of place where vmap batches the targets
    but not the logits or the upstream gradient (torch.func.vjp with a shared cotangent)."""
    alias = _alias(modules["CrossEntropy"])
    x = torch.randn(4, 6, dtype=torch.float64)
    targets = torch.stack([_targets(), _targets().flip(0), torch.zeros(4, dtype=torch.long)])

    def gradient(t):
        _, pullback = torch.func.vjp(lambda x: alias(x, t), x)
        return pullback(torch.tensor(1.0, dtype=torch.float64))[0]

    want = torch.stack([torch.func.grad(lambda x: F.cross_entropy(x, t))(x) for t in targets])
    torch.testing.assert_close(torch.func.vmap(gradient)(targets), want)
    torch.testing.assert_close(torch.func.vmap(lambda t: torch.func.grad(lambda x: alias(x, t))(x))(targets), want)


def test_fused_entropy_backward_reads_the_saved_row_value():
    """--fuse: softmax's VJP is its formula wherever forward computed its row sum (inductor
    fuses the elementwise passes): entropy's backward reads sum(p*log p) as saved."""
    source = generate_source("-sum(softmax(x, -1)*log_softmax(x, -1), -1)", "FusedEntropy", fuse=True)
    backward = source.split("def _fused_entropy_backward(")[1].split("\ndef ")[0]
    assert "def _fused_entropy_backward(grad_output, x, row0, row1," in source
    assert "row0 = logsumexp(x, -1)" in source and "row1 = sum(" in source  # (the saved comment)
    body = backward.split("return")[-1]
    after_recompute = backward.split("t0 = ")[-1]
    assert "row1" in body and "torch.sum" not in after_recompute and "_backward_data" not in after_recompute


def _generated(expr: str, name: str, tmp_path, **options):
    """The alias of a module generated from ``expr`` here."""
    return _alias(_module_of(generate_source(expr, name, **options), name, tmp_path))


@pytest.mark.parametrize("x_shape", [(6,), (1, 6)])
def test_a_tensor_param_may_broadcast_the_gathered_value_beyond_the_input(x_shape, tmp_path):
    """log_softmax(x, -1) + b with x of shape (H,) and b of (B, H): the scatter-added
    gradient is broadcast to the index's rows before the class values are added."""
    function = _generated("mean(-gather(log_softmax(x, -1) + b, t))", "ShiftedCE", tmp_path, inputs=("x",), params=("t", "b"))
    t, b = _targets(), torch.randn(4, 6, dtype=torch.float64)
    x = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
    want = -(torch.log_softmax(x, -1) + b).gather(-1, t[:, None]).mean()
    torch.testing.assert_close(torch.autograd.grad(function(x, t, b), x)[0], torch.autograd.grad(want, x)[0])
    assert torch.autograd.gradcheck(lambda v: function(v, t, b), (x,))
    assert torch.autograd.gradgradcheck(lambda v: function(v, t, b), (x,))


def test_terms_of_different_shapes_are_summed_to_the_input_each_on_its_own(tmp_path):
    """x*y - mean(x, -1) with x of shape (B, 1): the mean's term is one value per row and must
    not be broadcast along y's row before it is summed to x's shape."""
    function = _generated("x*y - mean(x, -1)", "RowTerms", tmp_path, inputs=("x", "y"))
    for x_shape in [(3, 1), (3, 4)]:
        x = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
        y = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(function, (x, y))
        assert torch.autograd.gradgradcheck(function, (x, y))


def test_class_values_take_the_gradient_dtype(tmp_path):
    """A float32 weight param beside bfloat16 logits: the scatter-added class values take the
    gradient's dtype (scatter_add refuses mixed dtypes)."""
    function = _generated("mean(-w*gather(log_softmax(x, -1), t))", "WeightedCE", tmp_path, inputs=("x",), params=("t", "w"))
    x = torch.randn(4, 6, requires_grad=True)
    w, t = torch.rand(4, 1), _targets()
    (want,) = torch.autograd.grad(function(x, t, w), x)
    low = x.detach().bfloat16().requires_grad_()
    (got,) = torch.autograd.grad(function(low, t, w), low)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-3)


def test_a_param_taken_per_row_is_refused_where_it_varies_along_the_row(tmp_path):
    """sum(log_softmax(x, -1)*m, -1): the softmax's row sum takes m as one value per row (no
    pass over the row); a mask of x's shape would make that gradient wrong, so it is refused
    in one line, and as an input it is right."""
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    as_param = _generated("sum(log_softmax(x, -1)*m, -1)", "MaskedRows", tmp_path, inputs=("x",), params=("m",))
    for m in (0.3, torch.rand(3, 1, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)):
        (got,) = torch.autograd.grad(as_param(x, m).sum(), x)
        (want,) = torch.autograd.grad((torch.log_softmax(x, -1) * m).sum(), x)
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match=r"m has shape \(3, 5\): the gradient takes it as one value per row"):
        as_param(x, torch.rand(3, 5, dtype=torch.float64))
    as_input = _generated("sum(log_softmax(x, -1)*m, -1)", "MaskedRowsInput", tmp_path, inputs=("x", "m"))
    m = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(as_input, (x, m)) and torch.autograd.gradgradcheck(as_input, (x, m))
