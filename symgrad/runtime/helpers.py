"""The helper functions generated modules carry, as real Python.

Each function here is copied, source line for source line, into every generated module
whose code calls it (``symgrad.codegen.printer.HELPERS`` reads this file's text with
:mod:`ast`; the generator never imports this module, nor torch). So each function must
stand alone: it may use ``torch`` and the other helpers here, and nothing else from this
file, and its name starts with an underscore, as it does in the generated module.

Each carries a one-line docstring, which the modules get; the reasons behind it sit in
the comment above it, which stays here. ``tests/test_runtime_helpers.py`` runs each on
tensors.
"""

import torch


# Inductor's GPU kernel for sigmoid (Triton's tl.sigmoid) uses a fast approximate exp: in
# float32 it is 9.6 ulps off at |u| = 50 (torch 2.11), where ATen's kernel is 0.6 ulps off.
# Written with exp(-|u|) it uses inductor's accurate exp instead (0.8 ulps), and autograd
# differentiates it exactly on each side of 0. Inductor's CPU kernel, and eager mode
# anywhere, are accurate: they keep torch.sigmoid. Fused modules call it (COMPILED_CALLS).
def _sigmoid(u):
    """torch.sigmoid(u), as accurate under torch.compile on a GPU as in eager mode."""
    if u.device.type == "cpu" or not torch.compiler.is_compiling():
        return torch.sigmoid(u)
    exp_minus_abs = torch.exp(torch.where(u > 0, -u, u))
    return torch.where(u > 0, 1, exp_minus_abs) / (1 + exp_minus_abs)


# F.mish, F.silu and F.logsigmoid have no integer kernel, where the formula's torch.sigmoid
# promotes an integer or bool tensor to the default float dtype.
def _floating(u):
    """``u`` as the default float dtype where it is an integer or bool tensor."""
    return u if u.is_floating_point() else u.to(torch.get_default_dtype())


# _erfcx and _log_ndtr call a torch function that has no float16 or bfloat16 kernel on the
# CPU (torch 2.13: "not implemented for 'Half'"): those compute in float32 and round back,
# as ATen's own half kernels do internally.
def _erfcx(u):
    """torch.special.erfcx(u), computed in float32 for float16 and bfloat16 inputs."""
    if u.dtype in (torch.float16, torch.bfloat16):
        return torch.special.erfcx(u.float()).to(u.dtype)
    return torch.special.erfcx(u)


def _log_ndtr(u):
    """torch.special.log_ndtr(u), computed in float32 for float16 and bfloat16 inputs."""
    if u.dtype in (torch.float16, torch.bfloat16):
        return torch.special.log_ndtr(u.float()).to(u.dtype)
    return torch.special.log_ndtr(u)


# Every body of more than one operation computes float16 in float32 (the planner's float16
# policy), as ATen's own float16 kernels do: they compute in float32 and round once. A
# formula of several eager operations would round at every step, and its intermediates
# overflow float16 (above 65504) long before its value does: 216*x/(x**2 + 6)**3 is 0 at
# x = 10 in float16 steps, where it is 1.8e-3. (bfloat16 has float32's range, and runs as
# written.) The result is float16 as _half_of decides; ``also`` holds the decisions of the
# outputs that depend on fewer of ``values``: where one is float16, float16 tensors widen too.
def _float32_for_half(*values, also=()):
    """``values`` with float16 tensors as float32, then the dtype to round results to (or None)."""
    if not any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in values):
        return (*values, None)  # (the common case, first: float32 pays 0.5 us here)
    half = _half_of(*values)
    if half is None and torch.float16 not in also:
        return (*values, None)
    widened = (v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v for v in values)
    return (*widened, half)


# As in torch's type promotion: the floating tensors with dimensions decide, or where there
# are none, the 0-d ones (a float32 param next to float16 activations takes their dtype).
# Each output of a module decides by the tensors it depends on.
def _half_of(*values):
    """torch.float16 where the result of ``values`` is float16, else None."""
    floating = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    deciding = [v for v in floating if v.dim() > 0] or floating
    return torch.float16 if deciding and all(v.dtype == torch.float16 for v in deciding) else None


# torch.result_type, in a form torch.compile traces: the input's dtype where it is
# floating; else type promotion's (0.5 with an int64 input is float32, as a Python number
# is; cast to int64 it would be 0).
def _dtype_with(reference, value):
    """The dtype that ``value`` (a param) takes as a tensor beside the input ``reference``."""
    if reference.is_floating_point():
        return reference.dtype
    if isinstance(value, torch.Tensor):
        return torch.promote_types(reference.dtype, value.dtype)
    if isinstance(value, float):
        return torch.get_default_dtype()
    return torch.int64 if reference.dtype == torch.bool and not isinstance(value, bool) else reference.dtype


# Refuses a result of a dtype ``target`` cannot hold, as torch's own in-place ops do
# (torch.tensor([1, 2]).exp_() raises; copy_ would truncate to [2, 7]): torch.can_cast, in a
# form torch.compile traces. Returns the names of the ``kept`` tensors (what backward reads)
# that the write changed: they share ``target``'s memory (mul_(a, a)), and
# _refuse_overwritten keeps backward from reading their new values. torch.compile cannot
# trace version counters, so under it nothing is reported.
def _overwrite(target, result, **kept):
    """``target.copy_(result)``; the names of the ``kept`` tensors that the write changed."""
    narrowed = result.is_floating_point() and not target.is_floating_point()
    if narrowed or (target.dtype == torch.bool and result.dtype != torch.bool):
        raise RuntimeError(f"result type {result.dtype} can't be cast to the desired output type {target.dtype}")
    if torch.compiler.is_compiling():
        target.copy_(result)
        return ()
    # (an inference tensor has no version counter, and cannot be saved for backward)
    tracked = {name: v for name, v in kept.items() if isinstance(v, torch.Tensor) and not v.is_inference()}
    versions = {name: value._version for name, value in tracked.items()}
    target.copy_(result)
    return tuple(name for name, version in versions.items() if tracked[name]._version != version)


# ``readers``: the inputs whose gradients read each kept tensor. Without this, backward would
# use the overwritten values silently (mul_(a, a) did); torch's own in-place ops raise there
# too ("modified by an inplace operation").
def _refuse_overwritten(ctx, **readers):
    """Raise where a wanted gradient reads a tensor that the in-place forward overwrote."""
    for name in ctx.overwritten:
        if any(ctx.needs_input_grad[i] for i in readers[name]):
            raise RuntimeError(
                f"{name} shares memory with the input this in-place function overwrote, and a gradient"
                f" reads {name}: pass a copy ({name}.clone())"
            )


# torch.gather takes any index no larger than its input along the other dims, and F.nll_loss
# any target that broadcasts nowhere: a target of shape (1,) or (B/2,) would pick from the
# first rows only, a silently wrong loss. gather(e, t) is a class pick, so t must be e's
# shape without its last dim exactly, as F.cross_entropy's target is.
def _gather_last(values, t):
    """values' element at class ``t`` along the last dim (kept): ``t`` has values' shape without it."""
    if not isinstance(t, torch.Tensor) or t.shape != values.shape[:-1]:
        got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        expected = tuple(values.shape[:-1])
        raise ValueError(f"gather: the class index has {got}; it must be an integer tensor of shape {expected}")
    return torch.gather(values, -1, t.unsqueeze(-1))


# A row-wise module's backward may take a param as one value per row where a row sum needs
# it (label smoothing's s: the softmax's row sum is then known, with no pass over the row).
# A param tensor that varies along the row (a mask) would make that gradient wrong: refused.
# (A param broadcasts from the last dim: a dim counted from the front of the input is
# checked only where the param is a single value.)
def _row_constant(value, param, dims):
    """Refuses the param ``value`` (named ``param``) where it varies along ``dims``."""
    if not isinstance(value, torch.Tensor):
        return
    if any((value.numel() != 1) if d >= 0 else (value.dim() >= -d and value.shape[d] != 1) for d in dims):
        raise ValueError(
            f"{param} has shape {tuple(value.shape)}: the gradient takes it as one value per row"
            f" (size 1 along dims {tuple(dims)}); make it an input to pass a value per element"
        )


# A jvp's tangent must have its output's exact shape: the engine does not broadcast it.
def _reduced_to(tangent, shape):
    """``tangent`` broadcast to ``shape``, then summed over the dimensions it has beyond it."""
    return tangent.expand(torch.broadcast_shapes(tangent.shape, shape)).sum_to_size(shape)


# A gather's gradient added to a full-size one, base*scale + shift (a softmax's output,
# scaled and shifted by values per row, in cross-entropy's VJP): written in base, since each
# out-of-place step allocates and writes a whole new tensor (about a third of
# cross-entropy's backward on a CPU). Where autograd records the steps (create_graph), base
# is what the softmax's backward reads: the first step then runs out of place. vmap refuses
# an in-place op whose other arguments are batched where the tensor it writes is not
# (targets vmapped, logits and upstream gradient shared): that step too runs out of place,
# raising before anything is written. A tensor param can broadcast the gather's operand
# beyond base (log_softmax(x, -1) + b, with x of shape (H,) and b of (B, H)): base is then
# broadcast to the index's rows first; and the values take base's dtype, as += would.
def _scatter_added(base, index, values, scale=None, shift=None):
    """``base*scale + shift`` (each where given) plus ``values`` at ``index`` along the last dim, in place in ``base`` (the caller's own) where autograd and vmap allow."""
    rows = torch.broadcast_shapes(base.shape[:-1], index.shape[:-1])
    if base.shape[:-1] != rows:
        base = base.expand(*rows, base.shape[-1]).clone()
    owned = (scale is None and shift is None) or not torch.is_grad_enabled()
    if scale is not None:
        try:
            base = base.mul_(scale) if owned else base * scale
        except RuntimeError:
            base = base * scale
        owned = True
    if shift is not None:
        try:
            base = base.add_(shift)
        except RuntimeError:
            base = base + shift
    values = values.to(base.dtype)
    try:
        return base.scatter_add_(-1, index, values)
    except RuntimeError:
        return base.scatter_add(-1, index, values)


def _round_to(half, *values):
    """``values`` (one or a tuple), floating tensors rounded to ``half`` unless it is None."""
    if half is not None:
        values = tuple(v.to(half) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values)
    return values[0] if len(values) == 1 else values


# torch.logsumexp is max-shifted: inductor's CPU code runs its max and its sum as two loops
# over all rows, reading the input twice, where the textbook log(sum(exp(u))) reads it once
# (torch 2.13's one-pass "online softmax" is for Triton only). Unshifted, the sum is exact
# wherever it lies in [2**-60, 2**100]: no exp overflows, and the terms that underflow (even
# flushed to zero) change it by less than 2**-126 each, below float32's resolution of a sum
# of 2**-60 for rows of up to 2**40 elements. So under torch.compile, float32 and float64 CPU tensors take the one-pass
# sum, and the max-shifted kernel only where some row's sum leaves that range (logits of 1e4,
# or all very negative). torch.cond keeps that choice inside one compiled graph; on a GPU its
# predicate would cost a device sync, and Triton's kernel is one pass already. Eager mode,
# other dtypes and devices, and a graph autograd records (create_graph) run torch.logsumexp.
def _logsumexp(u, dim):
    """torch.logsumexp(u, dim, keepdim=True); under torch.compile, in one pass where it can."""
    recorded = torch.is_grad_enabled() and u.requires_grad
    one_pass = u.device.type == "cpu" and u.dtype in (torch.float32, torch.float64) and not recorded
    if not (one_pass and torch.compiler.is_compiling()):
        return torch.logsumexp(u, dim, keepdim=True)
    total = torch.sum(torch.exp(u), dim, keepdim=True)
    moderate = ((total >= 2.0**-60) & (total <= 2.0**100)).all()
    return torch.cond(
        moderate, lambda total, u: torch.log(total), lambda total, u: torch.logsumexp(u, dim, keepdim=True), (total, u)
    )
