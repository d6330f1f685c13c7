"""Canaries for the PyTorch limits the README lists that reach generated modules.

Each test pins torch's current behaviour next to the workaround the README gives, so that
a torch release that fixes (or changes) the limit fails here, and the README's entry is
revisited.
"""

from __future__ import annotations

import torch
import torch.func as tf

from generated.shape_mix import shape_mix


class _HandWritten(torch.autograd.Function):
    """``exp(y), x*y`` written by hand, as torch's documentation shows a vmap-able Function."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, y):
        return torch.exp(y), x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad0, grad1):
        x, y = ctx.saved_tensors
        return grad1 * y, grad0 * torch.exp(y) + grad1 * x


def _gradient_by_y(function, batch, y, in_dims):
    def loss(y):
        taken = y if in_dims[1] is None else y.expand(batch.shape[0], *y.shape)
        return sum(output.sum() for output in tf.vmap(function, in_dims=in_dims)(batch, taken))

    return tf.grad(loss)(y)


def test_generated_vmap_rule_with_an_unbatched_input():
    """README, "Known PyTorch limits": generate_vmap_rule's backward counts an unbatched
    output's cotangent once per batch element (torch 2.13); batching every input is right."""
    generator = torch.Generator().manual_seed(0)
    batch = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(4, generator=generator, dtype=torch.float64)
    truth = 3 * torch.exp(y) + batch.sum(0)  # exp(y) is broadcast over the 3 rows
    for function in (shape_mix, _HandWritten.apply):
        torch.testing.assert_close(_gradient_by_y(function, batch, y, (0, 0)), truth)  # the workaround
        as_torch_computes = 3 * 3 * torch.exp(y) + batch.sum(0)
        torch.testing.assert_close(
            _gradient_by_y(function, batch, y, (0, None)),
            as_torch_computes,
            msg="torch's generated vmap rule changed: revisit the README's Known PyTorch limits entry",
        )
    eager = _gradient_by_y(lambda x, y: (torch.exp(y), x * y), batch, y, (0, None))
    torch.testing.assert_close(eager, truth)
