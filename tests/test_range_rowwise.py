"""Row-wise modules right across the float range (docs/stability.md, "Across the float range"):
the companion of tests/test_range.py for the modules in generated/ with reductions along a
dim, softmax, gather or chunk.

Each module runs on two fixed rows of inputs scaled by log-spaced magnitudes, from 1e-30 to
near the dtype's overflow, in float32 and float64, and is compared with an independent
mpmath evaluation of its formula (tests/rowwise_reference.py) at the same rounded inputs:

- the value, element by element, within RANGE_RTOL relatively, or within the dtype's
  smallest normal number absolutely;
- the gradient of ``sum(f*u)`` (a fixed upstream ``u``) by every input, and its second
  derivative along a fixed direction ``v`` of the scaled inputs, ``v'Hv``, against central
  differences at 60 digits: within RANGE_RTOL of the largest true entry of the gradient (a
  row's gradient entries are sums whose terms cancel, so an entry is held to its row's
  scale), or within the smallest normal absolutely.

A quantity whose true value is not a finite float of the dtype is not compared.
KNOWN_LIMITS lists where a module cannot meet this, with the reason.
"""

from __future__ import annotations

import functools
import math
import importlib
from dataclasses import dataclass
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import torch

from conftest import rowwise_generated_names
from rowwise_reference import sympy_rows
from symgrad.codegen.write import read_spec
from symgrad.frontend.parse import parse_spec
from symgrad.plan.rowwise import forward_outputs

# As tests/test_range.py's.
RANGE_RTOL = {torch.float32: 1e-4, torch.float64: 1e-9}

# Two rows of four, of mixed signs and no ties (amax, a norm's zero row and equal entries
# are other tests' business); a (4,) weight and bias.
ROWS = {
    "x": [[0.31, -1.23, 2.07, -0.68], [1.52, 0.44, -2.19, 0.93]],
    "y": [[-0.87, 1.91, 0.26, -1.44], [0.59, -0.35, 1.78, 2.33]],
}
WEIGHTS = {"w": [0.8, -1.1, 1.3, 0.6], "b": [0.2, -0.4, 0.1, 0.7]}
PARAMS = {"eps": 1e-6, "t": [2, 0], "s": 0.1}
# The direction of the second derivative, scaled as the rows are.
DIRECTION = [[0.52, 0.17, -0.94, 0.38], [-0.26, 0.81, 0.45, -0.63]]

MAGNITUDES = {
    torch.float32: (1e-30, 1e-20, 1e-10, 1e-4, 1.0, 1e4, 1e10, 1e15, 1e19, 1e20, 1e25, 1e30, 1e37),
    torch.float64: (1e-300, 1e-100, 1e-30, 1e-10, 1.0, 1e10, 1e30, 1e100, 1e150, 1e155, 1e200, 1e300),
}

# Where a module cannot be right, with the reason: a limit exempts its quantities (by
# name prefix) at magnitudes below ``below`` or from ``start`` on.
@dataclass(frozen=True)
class Limit:
    quantities: tuple[str, ...]
    below: float = 0.0
    start: float = math.inf
    reason: str = ""

    def exempts(self, magnitude: float, quantity: str) -> bool:
        named = any(quantity.startswith(q) for q in self.quantities)
        return named and (magnitude < self.below or magnitude >= self.start)


_ALL = ("value", "grad", "v'Hv")
_SQUARES = (
    "a sum of squares overflows (|x| from 1.8e19 in float32, 1.3e154 in float64) or its terms"
    " underflow (below 1e-19 and 1e-154): so do torch's own F.rms_norm, F.layer_norm,"
    " F.normalize and F.cosine_similarity, whose kernels do not scale the row"
)
_POWERS = (
    "the backward formula raises a row's sum of squares to the power 1.5, or its rstd to the"
    " third (RMSNorm's first-order gradient, double backward elsewhere): the cube leaves the"
    " dtype from |x| = 1e13 in float32 (1e102 in float64), where the squares alone do not"
)
_PRODUCTS = "x*y of two entries underflows below 1e-19 (1e-154) in the dot product and the squares"
_ENTROPY = (
    "the gradient -p*(log p + H) is O(|x|) for logits within |x| of each other, and is computed"
    " from O(1) terms: absolute error 1e-7 in float32 (1e-16 in float64), so 1e-4 relative fails"
    " below |x| = 1e-3 (1e-7); torch's Categorical(logits).entropy() likewise"
)
_SATURATED = "the double-backward formula multiplies a huge logit by a saturated derivative: inf*0"
F32, F64 = torch.float32, torch.float64
KNOWN_LIMITS: dict[tuple[str, torch.dtype], tuple[Limit, ...]] = {
    ("cosine_similarity", F32): (
        Limit(("value",), 1e-20, 1e19, _SQUARES),
        Limit(("grad",), 1e-19, 1e15, _POWERS),
        Limit(("v'Hv",), 1e-19, 1e10, _POWERS + "; its second derivative, the square of that"),
    ),
    ("cosine_similarity", F64): (
        Limit(("value",), 1e-150, 1e155, _SQUARES),
        Limit(("grad",), 1e-150, 1e150, _POWERS),
        Limit(("v'Hv",), 1e-30, 1e100, _POWERS + "; its second derivative, the square of that"),
    ),
    ("entropy", F32): (Limit(("grad",), below=1e-3, reason=_ENTROPY), Limit(("v'Hv",), start=1e19, reason=_SATURATED)),
    ("entropy", F64): (Limit(("grad",), below=1e-7, reason=_ENTROPY), Limit(("v'Hv",), start=1e155, reason=_SATURATED)),
    ("l2_normalize", F32): (Limit(("value", "grad"), 1e-20, 1e19, _SQUARES), Limit(("v'Hv",), 1e-19, 1e15, _POWERS)),
    ("l2_normalize", F64): (Limit(("value", "grad"), 1e-150, 1e155, _SQUARES), Limit(("v'Hv",), 1e-150, 1e150, _POWERS)),
    ("layer_norm", F32): (Limit(_ALL, start=1e19, reason=_SQUARES), Limit(("v'Hv",), start=1e15, reason=_POWERS)),
    ("layer_norm", F64): (Limit(_ALL, start=1e155, reason=_SQUARES), Limit(("v'Hv",), start=1e150, reason=_POWERS)),
    ("rms_norm", F32): (Limit(_ALL, start=1e19, reason=_SQUARES), Limit(("grad x", "v'Hv"), start=1e15, reason=_POWERS)),
    ("rms_norm", F64): (Limit(_ALL, start=1e155, reason=_SQUARES), Limit(("grad x", "v'Hv"), start=1e150, reason=_POWERS)),
    ("swi_glu", F32): (Limit(("v'Hv",), start=1e15, reason=_SATURATED),),
    ("swi_glu", F64): (Limit(("v'Hv",), start=1e150, reason=_SATURATED),),
}


def _spec(name: str):
    module = importlib.import_module(f"generated.{name}")
    return module, read_spec(Path(module.__file__).read_text())


def _inputs(parsed, magnitude: float, dtype) -> dict[str, torch.Tensor] | None:
    """The inputs at ``magnitude`` in ``dtype``, or None where a scaled row is not a finite
    normal float of it."""
    values = {}
    for input_name in (s.name for s in parsed.inputs):
        if input_name in ROWS:
            scaled = torch.tensor(ROWS[input_name], dtype=torch.float64) * magnitude
            value = scaled.to(dtype)
            if not torch.isfinite(value).all() or (value.abs() < torch.finfo(dtype).tiny).any():
                return None
        else:
            value = torch.tensor(WEIGHTS[input_name], dtype=dtype)
        values[input_name] = value
    return values


def _params(parsed) -> list:
    out = []
    for param in (s.name for s in parsed.params):
        value = PARAMS[param]
        out.append(torch.tensor(value) if isinstance(value, list) else value)
    return out


def _upstream(shape) -> np.ndarray:
    """A fixed upstream gradient: entries 0.7, -1.3, 0.4, 2.1, ... over the output's shape."""
    pattern = [0.7, -1.3, 0.4, 2.1, -0.9, 1.6]
    count = int(np.prod(shape)) if shape else 1
    return np.array([pattern[k % len(pattern)] for k in range(count)], dtype=float).reshape(shape)


@dataclass(frozen=True)
class _Exact:
    """A module's formula written out over scalar symbols, with its exact derivatives as
    mpmath functions of (input entries..., direction entries...)."""

    arguments: tuple[sympy.Symbol, ...]  # every input's entries, then the direction's
    shapes: dict[str, tuple[int, ...]]
    value: tuple  # one function per output entry
    gradients: dict[str, tuple]  # input -> one function per entry
    second: object  # v'Hv along the first input


@functools.lru_cache(maxsize=None)
def _exact(name: str) -> _Exact:
    module, spec = _spec(name)
    parsed = parse_spec(spec)
    (formula,) = forward_outputs(parsed)
    env, shapes, entries = {}, {}, {}
    for symbol in parsed.inputs:
        shape = tuple(np.shape(ROWS.get(symbol.name, WEIGHTS.get(symbol.name))))
        scalars = [sympy.Symbol(f"{symbol.name}_{k}", real=True) for k in range(int(np.prod(shape)))]
        env[symbol], shapes[symbol.name], entries[symbol.name] = np.array(scalars, dtype=object).reshape(shape), shape, scalars
    for symbol in parsed.params:
        value = PARAMS[symbol.name]
        env[symbol] = np.array(value) if isinstance(value, list) else sympy.Float(value, 30)
    value = np.ravel(sympy_rows(formula, env))
    upstream = [sympy.Float(u, 30) for u in np.ravel(_upstream((value.size,)))]
    loss = sum(v * u for v, u in zip(value, upstream))
    first = parsed.inputs[0].name
    direction = [sympy.Symbol(f"v_{k}", real=True) for k in range(len(entries[first]))]
    gradients = {n: [sympy.diff(loss, e) for e in scalars] for n, scalars in entries.items()}
    along = sum(v * g for v, g in zip(direction, gradients[first]))
    second = sum(v * sympy.diff(along, e) for v, e in zip(direction, entries[first]))
    arguments = tuple(e for n in entries for e in entries[n]) + tuple(direction)
    compiled = lambda e: sympy.lambdify(arguments, e, "mpmath", cse=True)  # noqa: E731
    return _Exact(
        arguments,
        shapes,
        tuple(compiled(v) for v in value),
        {n: tuple(compiled(g) for g in gs) for n, gs in gradients.items()},
        compiled(second),
    )


def _truths(name: str, tensors, magnitude: float, dtype):
    """The exact value (flat), gradients (input -> flat) and v'Hv at ``tensors``, with the
    direction v scaled by ``magnitude``: evaluated at a precision raised until two
    evaluations agree to 1e-25, or to 1e-3 of the dtype's smallest normal (past that, no
    comparison here can tell them apart)."""
    exact = _exact(name)
    point = [float(e) for n in exact.shapes for e in tensors[n].double().flatten()]
    point += [d * magnitude for d in np.ravel(DIRECTION)][: len(exact.arguments) - len(point)]

    def at(dps):
        with mpmath.workdps(dps):
            args = [mpmath.mpf(p) for p in point]
            return (
                [f(*args) for f in exact.value],
                {n: [f(*args) for f in fs] for n, fs in exact.gradients.items()},
                exact.second(*args),
                dps,
            )

    floor = float(torch.finfo(dtype).tiny) / 1000
    # (the derivatives' terms grow as magnitude**2 and cancel to the dtype's scale)
    start = 20 + 2 * math.ceil(abs(math.log10(magnitude))) + math.ceil(-math.log10(floor))
    previous = at(start)
    for dps in (2 * start, 4 * start):
        current = at(dps)
        if _agree(previous, current, floor):
            return current[:3]
        previous = current
    raise AssertionError(f"{name}: the exact evaluation does not settle at {magnitude}")


def _agree(a, b, floor: float) -> bool:
    flat = lambda t: [*t[0], *(e for g in t[1].values() for e in g), t[2]]  # noqa: E731
    with mpmath.workdps(b[3]):
        return all(abs(x - y) <= max(mpmath.mpf("1e-25") * abs(y), floor) for x, y in zip(flat(a), flat(b)))


def _got(alias, parsed, tensors, params, upstream, direction):
    leaves = {k: v.clone().requires_grad_(True) for k, v in tensors.items()}
    ordered = [leaves[s.name] for s in parsed.inputs]
    out = alias(*ordered, *params)
    u = torch.tensor(upstream, dtype=out.dtype).reshape(out.shape)
    loss = (out * u).sum()
    # (first order as a user runs it: a module may call ATen's backward kernels there)
    grads = torch.autograd.grad(loss, ordered, retain_graph=True)
    first = torch.autograd.grad(loss, ordered[0], create_graph=True)[0]
    v = torch.tensor(direction, dtype=out.dtype).reshape(ordered[0].shape)
    (hv,) = torch.autograd.grad((first * v).sum(), ordered[0])
    return out.detach(), {s.name: g.detach() for s, g in zip(parsed.inputs, grads)}, (hv * v).sum().item()


def spec_alias(spec) -> str:
    from symgrad.naming import snake_case

    return snake_case(spec.name)


def _finite_in(dtype, values) -> bool:
    top = mpmath.mpf(float(torch.finfo(dtype).max))
    return all(abs(e) <= top for e in np.ravel(np.asarray(values, dtype=object)))


def _close(got, exact, dtype, elementwise: bool) -> bool:
    rtol, tiny = RANGE_RTOL[dtype], float(torch.finfo(dtype).tiny)
    want = np.vectorize(float)(np.asarray(exact, dtype=object)).astype(float).reshape(np.shape(got))
    got = np.asarray(got, dtype=float)
    if not np.isfinite(got).all():
        return False
    if elementwise:
        return bool(np.all(np.abs(got - want) <= np.maximum(rtol * np.abs(want), tiny)))
    return bool(np.max(np.abs(got - want), initial=0.0) <= max(rtol * np.max(np.abs(want), initial=0.0), tiny))


def range_failures(name: str, dtype) -> list[tuple]:
    """Every (magnitude, quantity) where the module is not right, known limits included."""
    module, spec = _spec(name)
    parsed = parse_spec(spec)
    params = _params(parsed)
    alias = getattr(module, spec_alias(spec))
    failures = []
    for magnitude in MAGNITUDES[dtype]:
        tensors = _inputs(parsed, magnitude, dtype)
        if tensors is None:
            continue
        out_shape = tuple(alias(*[tensors[s.name] for s in parsed.inputs], *params).shape)
        upstream = _upstream(out_shape)
        value, gradients, second = _truths(name, tensors, magnitude, dtype)
        direction = np.asarray(DIRECTION, dtype=float) * magnitude
        got_value, got_grads, got_second = _got(alias, parsed, tensors, params, upstream, direction)
        checks = [("value", got_value.double().numpy().ravel(), np.array(value, dtype=object), True)]
        checks += [(f"grad {n}", got_grads[n].double().numpy().ravel(), np.array(gradients[n], dtype=object), False) for n in got_grads]
        checks += [("v'Hv", np.array([got_second]), np.array([second], dtype=object), False)]
        for quantity, got, exact, elementwise in checks:
            if not _finite_in(dtype, exact):
                continue
            if not _close(got, exact, dtype, elementwise):
                failures.append((magnitude, quantity))
    return failures


def test_every_rowwise_module_has_its_inputs_here():
    for name in rowwise_generated_names():
        _, spec = _spec(name)
        parsed = parse_spec(spec)
        names = [s.name for s in (*parsed.inputs, *parsed.params)]
        missing = [n for n in names if n not in ROWS and n not in WEIGHTS and n not in PARAMS]
        assert not missing, f"{name}: no range-test values for {missing}"


def _exempt(name: str, dtype, magnitude: float, quantity: str) -> bool:
    return any(limit.exempts(magnitude, quantity) for limit in KNOWN_LIMITS.get((name, dtype), ()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", rowwise_generated_names())
def test_rowwise_module_is_right_across_the_float_range(name, dtype):
    failures = range_failures(name, dtype)
    unexplained = [f for f in failures if not _exempt(name, dtype, *f)]
    assert not unexplained, f"{name} ({dtype}): (magnitude, quantity) {unexplained}"
    # Each limit is real: some quantity it exempts fails (else the entry is stale).
    for limit in KNOWN_LIMITS.get((name, dtype), ()):
        assert any(limit.exempts(*f) for f in failures), f"{name} ({dtype}): stale limit {limit}"
