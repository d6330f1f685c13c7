"""One inductor case (the generic test compiles every module with aot_eager).

Inductor's first compile costs about 10 s on these machines, so this stays a single,
representative case: a several-input function with a param and broadcasting, compiled
with dynamic shapes, compared with eager in values and gradients.
"""

from __future__ import annotations

import torch

from conftest import load


def test_inductor_matches_eager():
    module = load("blend")
    torch._dynamo.reset()
    compiled = torch.compile(module.blend, fullgraph=True, backend="inductor", dynamic=True)
    for n in (5, 8):  # a second size exercises the dynamic-shape graph
        generator = torch.Generator().manual_seed(n)
        x = torch.rand(3, n, generator=generator, dtype=torch.float64, requires_grad=True)
        y = torch.rand(n, generator=generator, dtype=torch.float64, requires_grad=True)
        x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        eager = module.blend(x, y, 0.7)
        got = compiled(x2, y2, 0.7)
        torch.testing.assert_close(got, eager)
        eager.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
        torch.testing.assert_close(y2.grad, y.grad)
