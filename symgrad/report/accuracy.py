"""Accuracy: each implementation's value and gradient against the exact ones, across the
float range, in float32 and float64.

An error is measured in units of the dtype's epsilon (so "1" is one ulp at 1.0):
``|got - exact| / max(|exact|, smallest normal) / eps``. Where the exact value overflows
the dtype, the right answer is that infinity; where the implementation returns inf or
nan and the exact value is finite, the error is infinite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import sympy

from .subject import Subject
from .truth import Truth

DTYPES = ("float32", "float64")
VALUE, GRADIENT = "value", "gradient"
# Points that are not singular themselves but where formulas often are.
SPECIAL_POINTS = (0.0, 1.0, -1.0)
# Relative offsets from a singular point, towards both sides.
NEAR = (1e-3, 1e-7, 1e-12)
# Roots of polynomial denominators are looked for only up to this degree.
MAX_ROOT_DEGREE = 4


@dataclass(frozen=True)
class Curve:
    """The errors of one quantity of one implementation along one input.

    Attributes:
        output: index of the output.
        input: the input swept (the others sit at their anchor values).
        quantity: VALUE, or GRADIENT (d output / d input).
        dtype: "float32" or "float64".
        implementation: its label (subject.GENERATED, EAGER, TORCH).
        x: the points, as the dtype holds them.
        errors: the error at each point in epsilons (inf: non-finite where the exact is not).
    """

    output: int
    input: str
    quantity: str
    dtype: str
    implementation: str
    x: tuple[float, ...]
    errors: tuple[float, ...]

    @property
    def worst(self) -> tuple[float, float]:
        """(largest error, a point where it occurs)."""
        if not self.errors:
            return 0.0, math.nan
        index = max(range(len(self.errors)), key=lambda i: self.errors[i])
        return self.errors[index], self.x[index]

    @property
    def non_finite(self) -> int:
        """Points where the implementation returned inf or nan and the exact result is finite."""
        return sum(1 for e in self.errors if math.isinf(e))


@dataclass
class Accuracy:
    """Every curve of a report, and the sweep's anchors (the other inputs' values)."""

    curves: list[Curve] = field(default_factory=list)
    anchors: dict[str, float] = field(default_factory=dict)


def magnitudes(per_decade: int, low: int = -30, high: int = 30) -> list[float]:
    """Log-spaced magnitudes from 10**low to 10**high, ``per_decade`` in each decade."""
    return [10.0 ** (k / per_decade) for k in range(low * per_decade, high * per_decade + 1)]


def sweep_points(expr_list: Iterable[sympy.Expr], symbol: sympy.Symbol, per_decade: int) -> list[float]:
    """Both signs of the log-spaced magnitudes, the special points, and the points where the
    formula is singular or removable (and a few steps either side), sorted."""
    points = set(SPECIAL_POINTS)
    for m in magnitudes(per_decade):
        points.update((m, -m))
    for singular in _singular_points(expr_list, symbol):
        points.add(singular)
        scale = abs(singular) or 1.0
        for step in NEAR:
            points.update((singular - step * scale, singular + step * scale))
    return sorted(points)


def _singular_points(exprs: Iterable[sympy.Expr], symbol: sympy.Symbol) -> set[float]:
    """Real roots of the denominators and of the arguments of logs and roots, where they
    are polynomials in ``symbol`` of low degree (the common cases; a point missed is still
    near a log-spaced one)."""
    found: set[float] = set()
    candidates = []
    for expr in exprs:
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, sympy.Pow) and (node.exp.is_negative or not node.exp.is_integer):
                candidates.append(node.base)
            elif isinstance(node, sympy.log):
                candidates.append(node.args[0])
    for candidate in candidates:
        try:
            poly = sympy.Poly(candidate, symbol)
        except sympy.PolynomialError:
            continue
        if poly.degree() < 1 or poly.degree() > MAX_ROOT_DEGREE or len(poly.free_symbols) > 1:
            continue
        try:
            found.update(float(r) for r in sympy.real_roots(poly))
        except (NotImplementedError, sympy.PolynomialError, TypeError):
            continue
    return {r for r in found if math.isfinite(r)}


def anchor_values(subject: Subject, domain: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Where the inputs not swept sit: the middle of each one's sampling domain (or, where
    that is 0, the middle of its upper half, so that a product with it is not 0)."""
    anchors = {}
    for name in subject.inputs:
        low, high = domain.get(name, (-3.0, 3.0))
        middle = (low + high) / 2
        anchors[name] = middle if middle != 0 else (middle + high) / 2
    return anchors


class _NoProgress:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def measure(
    subject: Subject,
    domain: dict[str, tuple[float, float]],
    per_decade: int = 2,
    dtypes: Sequence[str] = DTYPES,
    progress: Callable[[int], Any] = lambda total: _NoProgress(),
) -> Accuracy:
    """Every implementation's errors along every input, in every dtype.

    ``progress(total)`` makes a bar (``update(count)``, ``close()``, as tqdm's) that
    counts the exact evaluations, the slow part: one per point, output, input and dtype.
    """
    import torch

    result = Accuracy(anchors=anchor_values(subject, domain))
    symbols = subject.symbols
    by_name = {s.name: s for s in symbols}
    surrogate = set(subject.surrogate)
    tasks = []
    for name in subject.inputs:
        raw = sweep_points([out.expr for out in subject.outputs], by_name[name], per_decade)
        for dtype in dtypes:
            info = torch.finfo(getattr(torch, dtype))
            # The points as the dtype holds them: the exact values are computed at those.
            held = sorted({float(torch.tensor(p, dtype=getattr(torch, dtype))) for p in raw if abs(p) <= info.max})
            tasks.append((name, dtype, held))
    bar = progress(sum(len(held) for _, _, held in tasks) * len(subject.outputs))
    try:
        for name, dtype, held in tasks:
            _measure_sweep(subject, result, name, dtype, held, surrogate, bar)
    finally:
        bar.close()
    return result


def _measure_sweep(
    subject: Subject, result: Accuracy, name: str, dtype: str, held: list[float], surrogate: set[str], bar: Any
) -> None:
    """Add the curves along input ``name`` in ``dtype``, at the points ``held``, to ``result``."""
    import torch

    torch_dtype = getattr(torch, dtype)
    info = torch.finfo(torch_dtype)
    symbols = subject.symbols
    along = next(s for s in symbols if s.name == name)
    exact = []
    for out in subject.outputs:
        truth = Truth(out.expr, symbols, along)
        values = []
        for x in held:
            values.append(truth.at(_point(subject, result.anchors, name, x)))
            bar.update(1)
        exact.append(values)
    for label, function in subject.implementations.items():
        got = _evaluate(subject, function, result.anchors, name, held, torch_dtype)
        for index in range(len(subject.outputs)):
            for quantity, column in ((VALUE, 0), (GRADIENT, 1)):
                if quantity == GRADIENT and name in surrogate:
                    continue  # a surrogate gradient is not the derivative, by design
                xs, errors = [], []
                for k, x in enumerate(held):
                    want = exact[index][k][column]
                    if math.isnan(want):
                        continue  # outside the domain, or a pole
                    xs.append(x)
                    errors.append(error_in_eps(got[index][column][k], want, info))
                result.curves.append(Curve(index, name, quantity, dtype, label, tuple(xs), tuple(errors)))


def _point(subject: Subject, anchors: dict[str, float], name: str, x: float) -> list[float]:
    return [x if n == name else anchors[n] for n in subject.inputs] + list(subject.params.values())


def error_in_eps(got: float, want: float, info) -> float:
    """``got``'s error against the exact ``want`` in epsilons of the dtype ``info`` describes."""
    if abs(want) > info.max:
        # The exact value overflows the dtype (rounding to nearest: only beyond the largest
        # finite number plus half an ulp, which this ignores): inf is right.
        return 0.0 if got == math.copysign(math.inf, want) else math.inf
    if not math.isfinite(got):
        return math.inf
    return abs(got - want) / max(abs(want), info.tiny) / info.eps


def _evaluate(subject: Subject, function: Callable, anchors, name: str, xs: list[float], dtype) -> list:
    """[output][0: values, 1: derivatives along ``name``] at ``xs``, as float64 lists.

    A reduced output (sum, mean) is called one point at a time: its value at one element
    is the elementwise formula's. An in-place module is given a copy of its first input.
    """
    if any(out.reduction for out in subject.outputs):
        columns = [_call(subject, function, anchors, name, [x], dtype) for x in xs]
        return [[[c[i][q][0] for c in columns] for q in (0, 1)] for i in range(len(subject.outputs))]
    return _call(subject, function, anchors, name, xs, dtype)


def _call(subject: Subject, function: Callable, anchors, name: str, xs: list[float], dtype) -> list:
    import torch

    size = len(xs)
    leaves = {
        n: (torch.tensor(xs, dtype=dtype) if n == name else torch.full((size,), anchors[n], dtype=dtype)).requires_grad_()
        for n in subject.inputs
    }
    args = [leaves[n] for n in subject.inputs]
    if subject.inplace:
        args[0] = args[0].clone()
    try:
        outputs = function(*args, *subject.params.values())
    except Exception:  # an implementation that fails here is wrong here: nan everywhere
        return [[[math.nan] * size, [math.nan] * size] for _ in subject.outputs]
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    result = []
    for output in outputs:
        values = output.detach().to(torch.float64).reshape(-1).expand(size).tolist()
        if output.requires_grad:
            (gradient,) = torch.autograd.grad(output, leaves[name], torch.ones_like(output), retain_graph=True, allow_unused=True)
        else:
            gradient = None
        if gradient is None:
            gradient = torch.zeros(size, dtype=dtype)  # not differentiable (floor): 0 almost everywhere
        elif subject.outputs[len(result)].reduction == "mean":
            gradient = gradient * size  # the elementwise derivative, as the exact one is
        result.append([values, gradient.detach().to(torch.float64).tolist()])
    return result
