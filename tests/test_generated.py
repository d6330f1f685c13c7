"""The one generic test: every contract, for every module in generated/.

There is no per-file test code: each check reads what it needs from the module's
``__symgrad__`` metadata and skips only where the contract does not apply (e.g. forward
AD for an in-place Function), saying why.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from reference import evaluate
from symgrad.plan.docs import metadata_of

# Shapes that exercise broadcasting: the first input is full, later ones broadcast into it.
SHAPES = [(3, 4), (4,), (3, 1), (1, 4)]


def sample(module, device, dtype=torch.float64, seed=0, requires_grad=True, tensor_params=False):
    """Inputs drawn from each symbol's domain on ``device``, then the params' sample values.

    Drawn on the CPU in float64 and then moved, so that every device and dtype sees the same
    numbers."""
    meta = metadata_of(module)
    generator = torch.Generator().manual_seed(seed)
    args = []
    for index, name in enumerate(meta["inputs"]):
        low, high = meta["domain"][name]
        shape = SHAPES[0] if meta["inplace"] else SHAPES[index % len(SHAPES)]
        value = low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)
        args.append(value.to(device=device, dtype=dtype).requires_grad_(requires_grad))
    for name, value in meta["params"].items():
        args.append(torch.tensor(value, dtype=dtype, device=device) if tensor_params else value)
    return args


def functional(module):
    alias = getattr(module, metadata_of(module)["alias"])
    if metadata_of(module)["inplace"]:
        # In place on a non-leaf copy, so that gradcheck's leaves stay intact.
        return lambda first, *rest: alias(first.clone(), *rest)
    return alias


def differentiable_part(module):
    """The function restricted to its differentiable outputs.

    gradcheck's forward-mode comparison misreads outputs marked non-differentiable
    (their Jacobian columns are compared against the wrong output), so those outputs are
    checked separately, by test_nondifferentiable_outputs_are_marked.
    """
    fn = functional(module)
    dead = metadata_of(module)["nondifferentiable"]
    if not dead:
        return fn
    return lambda *args: tuple(o for k, o in enumerate(as_tuple(fn(*args))) if k not in dead)


def as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def test_forward_matches_independent_evaluation(module, device):
    meta = metadata_of(module)
    args = sample(module, device, requires_grad=False)
    names = meta["inputs"] + list(meta["params"])
    values = {name: np.asarray(a.detach().cpu().numpy() if torch.is_tensor(a) else a) for name, a in zip(names, args)}
    expected = evaluate(meta["expr"], values)
    actual = as_tuple(functional(module)(*args))
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        # The reference broadcasts every input; an output that uses fewer of them (exp(y) next
        # to x*y) keeps its own, smaller shape.
        got = np.broadcast_to(got.detach().cpu().numpy(), np.shape(want))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_gradcheck(module, device):
    meta = metadata_of(module)
    if meta["surrogate"]:
        pytest.skip("a surrogate gradient is not the derivative: test_surrogate_gradient checks it")
    inplace = meta["inplace"]
    assert gradcheck(
        differentiable_part(module),
        sample(module, device),
        check_forward_ad=not inplace,
        check_batched_grad=not inplace,
        check_batched_forward_grad=not inplace,
    )


def test_gradgradcheck(module, device):
    meta = metadata_of(module)
    if meta["surrogate"]:
        pytest.skip("a surrogate gradient is not the derivative")
    source = open(module.__file__).read()
    if "double backward (create_graph=True) is not supported" in source:
        # Double backward is refused loudly, never silently wrong.
        with pytest.raises(RuntimeError, match="double backward"):
            gradgradcheck(functional(module), sample(module, device))
        return
    assert gradgradcheck(differentiable_part(module), sample(module, device), check_fwd_over_rev=not meta["inplace"])


def test_surrogate_gradient(module, device):
    """A declared surrogate replaces the derivative: backward must compute exactly it."""
    meta = metadata_of(module)
    if not meta["surrogate"]:
        pytest.skip("no surrogate gradient")
    args = sample(module, device)
    names = meta["inputs"] + list(meta["params"])
    output = functional(module)(*args)
    upstream = torch.linspace(0.5, 1.5, output.numel(), dtype=output.dtype, device=device).reshape(output.shape)
    inputs = args[: len(meta["inputs"])]
    grads = torch.autograd.grad(output, inputs, upstream)
    values = {n: np.asarray(a.detach().cpu().numpy() if torch.is_tensor(a) else a) for n, a in zip(names, args)}
    for name, arg, grad in zip(meta["inputs"], inputs, grads):
        if name in meta["surrogate"]:
            (declared,) = evaluate(meta["surrogate"][name], values)
            expected = np.broadcast_to(declared, output.shape) * upstream.cpu().numpy()
            np.testing.assert_allclose(grad.cpu().numpy(), expected.reshape(arg.shape), rtol=1e-12)


def test_tensor_params(module, device):
    meta = metadata_of(module)
    if not meta["params"]:
        pytest.skip("no params")
    as_numbers = as_tuple(functional(module)(*sample(module, device)))
    as_tensors = as_tuple(functional(module)(*sample(module, device, tensor_params=True)))
    for a, b in zip(as_numbers, as_tensors):
        torch.testing.assert_close(a, b)
    assert gradcheck(differentiable_part(module), sample(module, device, tensor_params=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_is_kept(module, dtype, device):
    args = sample(module, device, dtype=dtype)
    outputs = as_tuple(functional(module)(*args))
    for output in outputs:
        assert output.dtype == dtype and output.device == args[0].device
    live = [o for o in outputs if o.requires_grad]
    differentiable = [a for a in args if torch.is_tensor(a) and a.requires_grad]
    grads = torch.autograd.grad([o.sum() for o in live], differentiable, allow_unused=True)
    for arg, grad in zip(differentiable, grads):
        if grad is not None:
            assert grad.dtype == dtype and grad.shape == arg.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda d: str(d).split(".")[-1])
def test_narrow_dtypes_agree_with_float64(module, dtype, device):
    """Values and gradients in float16, bfloat16 and float32 agree with float64 at the same
    (rounded) inputs, to 4 units of the dtype's rounding (eps) of each element plus 4 of the
    output's largest one (an element near a zero of the function keeps only that absolute
    accuracy): no overflow and no precision lost inside the generated code at the sampled
    inputs. (On the CPU the worst is 0.73 such units, pair_speed in float32.)"""
    narrow = sample(module, device, dtype=dtype)
    wide = [a.detach().double().requires_grad_() if torch.is_tensor(a) else a for a in narrow]
    results = []
    for args in (narrow, wide):
        outputs = as_tuple(functional(module)(*args))
        live = [o for o in outputs if o.requires_grad]
        tensors = [a for a in args if torch.is_tensor(a)]
        grads = torch.autograd.grad([o.sum() for o in live], tensors, allow_unused=True)
        results.append(list(outputs) + [g for g in grads if g is not None])
    assert len(results[0]) == len(results[1])
    tolerance = 4 * torch.finfo(dtype).eps
    for got, want in zip(*results):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance * scale, check_device=True)


def test_float16_is_the_float32_computation_rounded(module, device):
    """float16 values, gradients and tangents are the float32 module's at the same inputs,
    rounded to float16, within the contract's 4 units of its rounding: a body either
    computes in float32 and rounds once (printer.HELPERS' _float32_for_half), as ATen's own
    float16 kernels do, or runs op by op in float16 where that keeps the contract
    (symgrad.math.half). First-order gradients (where an ATen backward kernel may compute
    them) and double backward too, and under --save speed, whose derivatives forward
    returns in float32 (a float16 one overflows where the gradient does not)."""
    dtype = torch.float16
    if metadata_of(module)["inplace"]:
        pytest.skip("in place: forward writes its float16 input, step by step")
    half = sample(module, device, dtype=dtype, tensor_params=True)
    wide = [a.detach().float().requires_grad_(a.requires_grad) for a in half]
    results = []
    for args in (half, wide):
        outputs = as_tuple(functional(module)(*args))
        live = [o for o in outputs if o.requires_grad]
        tensors = [a for a in args if a.requires_grad]
        # (first order alone may take another path: an ATen backward kernel, symgrad.rewrite.kernels)
        first = torch.autograd.grad([o.sum() for o in live], tensors, allow_unused=True, retain_graph=True)
        grads = torch.autograd.grad([o.sum() for o in live], tensors, allow_unused=True, create_graph=True)
        grads = [g for g in (*first, *grads) if g is not None]
        # (double backward: the first input's row of second derivatives, where there is one)
        twice = [g.sum() for g in grads[len(grads) // 2 :][:1] if g.requires_grad]
        second = [h for h in torch.autograd.grad(twice, tensors, allow_unused=True) if h is not None] if twice else []
        primals = [a.detach() for a in args]
        tangents = [torch.ones_like(a) for a in primals]
        if metadata_of(module)["nondifferentiable"]:
            pushed = ()  # (forward AD through a marked output: test_jacfwd_equals_jacrev's domain)
        else:
            pushed = as_tuple(torch.func.jvp(functional(module), tuple(primals), tuple(tangents))[1])
        results.append([*outputs, *grads, *second, *pushed])
    for got, want in zip(*results):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.to(dtype), rtol=4 * torch.finfo(dtype).eps, atol=0)


def test_nondifferentiable_outputs_are_marked(module, device):
    meta = metadata_of(module)
    outputs = as_tuple(functional(module)(*sample(module, device)))
    for index, output in enumerate(outputs):
        assert output.requires_grad == (index not in meta["nondifferentiable"])


def test_each_output_alone_gets_its_own_gradient(module, device):
    """An output the caller leaves unused gets no gradient (None, not zeros): each live
    output used alone gives the gradients of its own formula, first and second order."""
    outputs_of = lambda args: as_tuple(functional(module)(*args))  # noqa: E731
    args = sample(module, device)
    live = [k for k, o in enumerate(outputs_of(args)) if o.requires_grad]
    if len(live) < 2:
        pytest.skip("one differentiable output")
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    for k in live:
        outputs = outputs_of(args)
        alone = torch.autograd.grad(outputs[k].sum(), tensors, allow_unused=True, create_graph=True)
        weights = [torch.ones_like(o) if j == k else torch.zeros_like(o) for j, o in enumerate(outputs) if j in live]
        weighted = torch.autograd.grad([outputs[j] for j in live], tensors, weights, allow_unused=True, retain_graph=True)
        for got, want, tensor in zip(alone, weighted, tensors):
            zeros = torch.zeros_like(tensor)
            torch.testing.assert_close(zeros if got is None else got, zeros if want is None else want)
        if any(g is not None and g.requires_grad for g in alone):
            twice = sum(g.sum() for g in alone if g is not None and g.requires_grad)
            torch.autograd.grad(twice, tensors, allow_unused=True)  # (runs with absent upstreams)


def test_an_unused_overflowing_output_leaves_the_gradient_finite():
    """ShapeMix = (exp(y), x*y): used only through x*y, its gradient by y is x even where
    exp(y) overflows (a materialised zero times exp(y)'s inf derivative would be nan)."""
    from generated.shape_mix import shape_mix

    x = torch.tensor([2.0, -3.0], requires_grad=True)
    y = torch.tensor([100.0, 1000.0], requires_grad=True)
    grad_x, grad_y = torch.autograd.grad(shape_mix(x, y)[1].sum(), (x, y))
    torch.testing.assert_close(grad_y, x.detach())
    torch.testing.assert_close(grad_x, y.detach())


def _not_inplace(module):
    if metadata_of(module)["inplace"]:
        pytest.skip("torch.func transforms do not support in-place (mark_dirty) Functions")


def test_vmap_matches_loop(module, device):
    _not_inplace(module)
    args = sample(module, device, requires_grad=False)
    n_inputs = len(metadata_of(module)["inputs"])
    batched = [torch.stack([a * (1 + 0.01 * k) for k in range(3)]) for a in args[:n_inputs]]
    fn = functional(module)
    in_dims = (0,) * n_inputs + (None,) * (len(args) - n_inputs)
    got = as_tuple(torch.func.vmap(fn, in_dims=in_dims)(*batched, *args[n_inputs:]))
    for k in range(3):
        want = as_tuple(fn(*[b[k] for b in batched], *args[n_inputs:]))
        for g, w in zip(got, want):
            torch.testing.assert_close(g[k], w)


def test_jacfwd_equals_jacrev(module, device):
    _not_inplace(module)
    meta = metadata_of(module)
    if meta["surrogate"]:
        pytest.skip("a surrogate defines only the backward and jvp it declares")
    args = sample(module, device, requires_grad=False)
    n_inputs = len(meta["inputs"])
    argnums = tuple(range(n_inputs))
    fn = functional(module)
    forward = torch.func.jacfwd(fn, argnums=argnums)(*args)
    reverse = torch.func.jacrev(fn, argnums=argnums)(*args)
    torch.testing.assert_close(forward, reverse)


def test_hessian_equals_jacrev_of_jacrev(module, device):
    """Second derivatives forward-over-reverse (torch.func.hessian) and reverse-over-reverse
    agree. (Forward-over-forward, jacfwd of jacfwd, is 0 through any Function with a custom
    jvp: README, "Known PyTorch limits".)"""
    _not_inplace(module)
    meta = metadata_of(module)
    if meta["surrogate"]:
        pytest.skip("a surrogate defines only the backward and jvp it declares")
    if "double backward (create_graph=True) is not supported" in open(module.__file__).read():
        pytest.skip("no double backward")
    args = sample(module, device, requires_grad=False)
    argnums = tuple(range(len(meta["inputs"])))
    fn = functional(module)

    def total(*inputs):
        return sum(output.sum() for output in as_tuple(fn(*inputs)))

    hessian = torch.func.hessian(total, argnums=argnums)(*args)
    reverse = torch.func.jacrev(torch.func.jacrev(total, argnums=argnums), argnums=argnums)(*args)
    torch.testing.assert_close(hessian, reverse)


def test_compile_matches_eager(module, device):
    # (--inplace modules too: torch.compile, unlike the torch.func transforms, takes mark_dirty)
    torch._dynamo.reset()
    fn = functional(module)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    eager_args = sample(module, device)
    compiled_args = sample(module, device)
    eager = as_tuple(fn(*eager_args))
    got = as_tuple(compiled(*compiled_args))
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e)
    live = [k for k, e in enumerate(eager) if e.requires_grad]
    sum(eager[k].sum() for k in live).backward()
    sum(got[k].sum() for k in live).backward()
    for e, c in zip(eager_args, compiled_args):
        if torch.is_tensor(e) and e.requires_grad:
            torch.testing.assert_close(c.grad, e.grad)


def test_forward_signature_is_set_once(module):
    # Function.apply binds each call's arguments with inspect.signature(forward); a set
    # __signature__ spares rebuilding it per call. It must name forward's real parameters.
    classes = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, torch.autograd.Function) and value.__module__ == module.__name__
    ]
    assert classes
    for cls in classes:
        if metadata_of(module)["inplace"]:
            # forward(ctx, ...) without setup_context: apply binds nothing.
            assert not hasattr(cls.forward, "__signature__")
            continue
        code = cls.forward.__code__
        assert list(cls.forward.__signature__.parameters) == list(code.co_varnames[: code.co_argcount])
