"""Cost: the bytes autograd saves for backward, and the time of one forward plus backward,
for each implementation and for ``torch.compile`` of the eager formula.

``benchmarks/bench.py`` counts saved bytes with :func:`saved_bytes` too.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .subject import EAGER, Subject

COMPILED = "torch.compile"


@dataclass(frozen=True)
class Cost:
    """One implementation's cost at ``size`` elements per input.

    Attributes:
        implementation: its label.
        saved_per_element: bytes saved for backward per element.
        median_ms: fwd+bwd time, the median of the timed runs.
        ratio: median_ms over eager autograd's.
    """

    implementation: str
    saved_per_element: float
    median_ms: float
    ratio: float


def saved_bytes(torch, function: Callable, inputs: Sequence) -> int:
    """Bytes of the unique storages autograd saves for backward during one forward."""
    return sum(saved_storages(torch, function, inputs).values())


def saved_storages(torch, function: Callable, inputs: Sequence) -> dict:
    """The unique storages autograd saves for backward during one forward of
    ``function(*inputs)``: their bytes, by (data pointer, device)."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[(storage.data_ptr(), tensor.device)] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function(*inputs)
    del out
    return storages


def measure(
    subject: Subject, size: int, repeats: int, compile: bool = True, dtype: str = "float32", threads: int | None = None
) -> list[Cost]:
    """Saved bytes and fwd+bwd times of every implementation, and of ``torch.compile`` of
    the eager formula unless ``compile`` is false, at ``size`` elements, inputs drawn from
    the module's domain. Implementations are timed round-robin so that load from other
    processes hits them alike. ``threads``: torch's thread count for the run (None: as set)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    leaves = []
    for name in subject.inputs:
        low, high = subject.domain.get(name, (-3.0, 3.0))
        leaves.append((low + (high - low) * torch.rand(size, generator=generator, dtype=torch_dtype)).requires_grad_())
    params = list(subject.params.values())
    functions = dict(subject.implementations)
    if compile:
        torch._dynamo.reset()
        functions[COMPILED] = torch.compile(subject.implementations[EAGER])

    def step(function):
        args = list(leaves)
        if subject.inplace:
            args[0] = args[0].clone()
        outs = function(*args, *params)
        outs = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if o.requires_grad]
        if outs:
            torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)

    def saved(function):
        args = list(leaves)
        if subject.inplace:
            args[0] = args[0].clone()
        return saved_bytes(torch, function, [*args, *params])

    for function in functions.values():
        step(function)  # (the first call compiles where it compiles)
        step(function)
    samples: dict[str, list[float]] = {label: [] for label in functions}
    for _ in range(repeats):
        for label, function in functions.items():
            start = time.perf_counter()
            step(function)
            samples[label].append((time.perf_counter() - start) * 1e3)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    return [
        Cost(label, saved(function) / size, medians[label], medians[label] / medians[EAGER])
        for label, function in functions.items()
    ]
