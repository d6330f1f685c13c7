"""Derivatives through row-wise functions: reverse mode (the VJP) and forward mode (the jvp),
symbolically, over the expression's DAG.

An elementwise output's gradient is ``grad_output * df/dx``; through a reduction it is not:
the adjoint of ``sum(e, -1)`` is broadcast back along -1, that of ``e`` in an elementwise
node whose other operand was reduced is summed along the reduced dims. So the VJP is built
as autograd builds it, node by node from the output down, with each row-wise function's
own rule (:meth:`symgrad.math.reductions.RowFunction.vjp`), and simplified and CSE'd as
one expression afterwards.

Shapes are tracked as *reduced dims*: the dims along which a value has size 1 (kept by a
reduction), or :data:`EVERY` for a 0-d value (a whole-tensor reduction, a number).
"""

from __future__ import annotations

from typing import Union

import sympy

from ..math.reductions import (
    BackwardValue,
    Chunk,
    ChunkCat,
    Count,
    Gather,
    ReduceSum,
    RowFunction,
    Scatter,
    ScatterAdd,
    Softmax,
    WHOLE,
    dims_tuple,
)

EVERY = "every"  # every dim reduced: a 0-d value

# Where a softmax's VJP is its formula (vjp's row_sums): where its row sum simplifies, also
# where it is forward's row value, or nowhere.
KNOWN, FORWARD, KERNELS = "known", "forward", "kernels"
Dims = Union[frozenset, str]


def reduced_dims(expr: sympy.Basic, inputs: frozenset[sympy.Symbol], known: dict | None = None) -> Dims:
    """The dims along which ``expr`` has size 1 (or :data:`EVERY` where it is 0-d), for
    tensors ``inputs`` of full shape and the symbols in ``known`` of the dims given there;
    numbers and params broadcast like a 0-d value."""
    shapes = _Shapes(inputs)
    shapes.known.update(known or {})
    return shapes.of(expr)


class _Shapes:
    def __init__(self, inputs: frozenset[sympy.Symbol]) -> None:
        self.inputs = inputs
        self.known: dict[sympy.Basic, Dims] = {}

    def of(self, expr: sympy.Basic) -> Dims:
        if expr in self.known:
            return self.known[expr]
        if expr in self.inputs or isinstance(expr, (Scatter, ScatterAdd)):
            found: Dims = frozenset()
        elif isinstance(expr, RowFunction):
            operand = self.of(expr.operand)
            if expr.keeps_shape:
                found = operand
            elif isinstance(expr, Gather) or expr.dims:
                found = union(operand, frozenset(int(d) for d in expr.dims))
            else:
                found = EVERY
        elif isinstance(expr, Count) or not expr.free_symbols & (self.inputs | self.known.keys()):
            found = EVERY  # numbers and params: they broadcast
        else:
            found = EVERY
            for arg in _operands(expr):
                found = intersection(found, self.of(arg))
        self.known[expr] = found
        return found


def union(a: Dims, b: Dims) -> Dims:
    return EVERY if EVERY in (a, b) else a | b


def intersection(a: Dims, b: Dims) -> Dims:
    if a == EVERY:
        return b
    if b == EVERY:
        return a
    return a & b


def _operands(expr: sympy.Basic) -> tuple[sympy.Basic, ...]:
    """The sub-expressions a value flows through: a Piecewise's values, not its conditions."""
    if isinstance(expr, sympy.Piecewise):
        return tuple(value for value, _ in expr.args)
    if isinstance(expr, RowFunction):
        return (expr.operand,)
    return tuple(a for a in expr.args if isinstance(a, sympy.Expr))


def _partials(node: sympy.Expr) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """Each operand of the elementwise ``node`` with d(node)/d(operand)."""
    if node.is_Add:
        return [(arg, sympy.S.One) for arg in node.args]
    if node.is_Mul:
        return [(arg, sympy.Mul(*(node.args[:i] + node.args[i + 1 :]))) for i, arg in enumerate(node.args)]
    if node.is_Pow:
        base, exponent = node.args
        found = []
        if base.free_symbols:
            found.append((base, exponent * base ** (exponent - 1)))
        if exponent.free_symbols:
            found.append((exponent, node * sympy.log(base)))
        return found
    operands = _operands(node)
    dummies = [sympy.Dummy(f"a{i}", real=True) for i in range(len(operands))]
    replaced = node.xreplace(dict(zip(operands, dummies)))
    back = dict(zip(dummies, operands))
    return [(arg, replaced.diff(d).xreplace(back)) for arg, d in zip(operands, dummies)]


def _topological(roots: list[sympy.Expr]) -> list[sympy.Expr]:
    """Every sub-expression of ``roots`` once, each before the sub-expressions it uses."""
    order: list[sympy.Expr] = []
    seen: set[sympy.Expr] = set()

    def visit(node: sympy.Expr) -> None:
        stack = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            if expanded:
                order.append(current)
                continue
            if current in seen:
                continue
            seen.add(current)
            stack.append((current, True))
            for arg in _operands(current):
                if arg not in seen:
                    stack.append((arg, False))

    for root in roots:
        visit(root)
    return order[::-1]


class KernelGradient(BackwardValue):
    """``upstream * f'(u)`` computed by ATen's backward kernel for ``f`` (rewrite.kernels.KERNELS):
    one pass, where the formula takes several. Args: upstream, u, f's name as a Symbol."""

    def _symgrad_torch(self, printer):
        upstream, u, kind = self.args
        return _BACKWARD_KERNELS_BY_NAME[kind.name].call(printer._print(upstream), printer._print(u))

    def _sympystr(self, printer):
        upstream, u, kind = self.args
        return f"{printer._print(upstream)}*{kind.name}'({printer._print(u)})"


def formula_of_kernels(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each KernelGradient written as its formula, ``upstream * f'(u)``:
    differentiable, for create_graph's backward."""

    def formula(node: KernelGradient) -> sympy.Expr:
        upstream, u, kind = node.args
        function = {cls.__name__: cls for cls in _BACKWARD_KERNELS}[kind.name]
        dummy = sympy.Dummy("u", real=True)
        return upstream * function(dummy).diff(dummy).xreplace({dummy: u})

    return expr.replace(lambda e: isinstance(e, KernelGradient), formula)


def _kernels() -> dict:
    from ..math.functions import mish, sigmoid, silu, softplus
    from ..rewrite.kernels import KERNELS

    by_name = {kernel.function: kernel for kernel in KERNELS}
    classes = {"softplus": softplus, "silu": silu, "sigmoid": sigmoid, "tanh": sympy.tanh, "mish": mish}
    return {classes[name]: kernel for name, kernel in by_name.items() if name in classes}


_BACKWARD_KERNELS = _kernels()
_BACKWARD_KERNELS_BY_NAME = {cls.__name__: kernel for cls, kernel in _BACKWARD_KERNELS.items()}


def vjp(
    outputs: list[sympy.Expr],
    adjoints: list[sympy.Symbol],
    inputs: tuple[sympy.Symbol, ...],
    row_sums: str = KNOWN,
    assumed: set | None = None,
) -> tuple[sympy.Expr, ...]:
    """The gradient of each input: the sum over outputs of ``adjoint * d(output)/d(input)``,
    by reverse mode over the outputs' DAG.

    ``row_sums`` says where a softmax's or log_softmax's VJP is its formula, not ATen's
    backward kernel (:func:`_softmax_vjp`): :data:`KNOWN`, where the row sum it reads
    simplifies to values per row; :data:`FORWARD`, also where it is a row value forward
    computed (which the planner saves: the form for compiled bodies, where inductor fuses
    the formula's elementwise passes into one); :data:`KERNELS`, nowhere (the faster form
    where backward reads a log_softmax forward saved, --save speed: the kernel takes it as
    it is, where the formula needs its exp).

    A param is taken to be constant along a row where a row sum needs it (label smoothing's
    ``s``): each such param, with the dims, is added to ``assumed``, for the module to
    refuse a value of it that varies along them."""
    shapes = _Shapes(frozenset(inputs))
    for output, seed in zip(outputs, adjoints):
        shapes.known[seed] = shapes.of(output)  # (an upstream gradient has its output's shape)
    adjoint: dict[sympy.Expr, sympy.Expr] = {}
    for output, seed in zip(outputs, adjoints):
        adjoint[output] = adjoint.get(output, sympy.S.Zero) + seed
    wanted = frozenset(inputs)
    order = _topological(outputs)
    sums = _RowSums(shapes, frozenset(order) if row_sums == FORWARD else frozenset(), frozenset(adjoints))
    sums.assumed = assumed if assumed is not None else set()
    for node in order:
        if node not in adjoint or node in wanted or not (node.free_symbols & wanted):
            continue
        upstream = adjoint[node]
        if isinstance(node, Chunk):
            continue  # (its input's gradient puts the chunks' side by side, below)
        if isinstance(node, Softmax):
            vjp_of_node = node.vjp(upstream) if row_sums == KERNELS else _softmax_vjp(node, upstream, sums)
            contributions = [(node.operand, vjp_of_node)]
        elif isinstance(node, RowFunction):
            contributions = [(node.operand, node.vjp(upstream))]
        elif type(node) in _BACKWARD_KERNELS and node.args[0].free_symbols & wanted:
            # upstream * f'(u) in one ATen pass (silu_backward, softplus_backward, ...)
            contributions = [(node.args[0], KernelGradient(upstream, node.args[0], sympy.Symbol(type(node).__name__)))]
        else:
            contributions = [(arg, upstream * partial) for arg, partial in _partials(node)]
        for arg, value in contributions:
            if not (arg.free_symbols & wanted) or value == 0:
                continue
            if not isinstance(node, RowFunction):
                value = _summed_to(value, node, shapes.of(arg), shapes)
            adjoint[arg] = adjoint.get(arg, sympy.S.Zero) + value
    for node in list(adjoint):
        if isinstance(node, Chunk) and node.operand in wanted and node.operand in inputs:
            pieces = [adjoint.get(Chunk(node.operand, node.count, k), sympy.S.Zero) for k in range(node.count)]
            if node.index == next(k for k, p in enumerate(pieces) if p != 0):  # (once per input)
                adjoint[node.operand] = adjoint.get(node.operand, sympy.S.Zero) + ChunkCat(*pieces)
    gradients = (adjoint.get(x, sympy.S.Zero) for x in inputs)
    return tuple(_scatters_added(g, shapes) for g in gradients)


def _softmax_vjp(node: Softmax, upstream: sympy.Expr, row_sums: "_RowSums") -> sympy.Expr:
    """A softmax's or log_softmax's VJP: its formula where the row sum it reads simplifies
    (:class:`_RowSums`), else ATen's backward kernel.

    The kernel takes the adjoint ``g`` as a full tensor and sums it along the row. Where
    ``g`` is a gather's adjoint plus values constant along the row (cross-entropy, label
    smoothing) the sum is known per row: the formula is then one softmax, scaled and
    shifted, and an in-row scatter_add, with no zero tensor, no one-hot and no pass to sum
    ``g``. Where ``g`` is a softmax times values per row (entropy's log_softmax), the
    formula cancels to 0."""
    total = row_sums.of(node.summed_in_vjp(upstream), node.dims, node)
    if total is None:
        return node.vjp(upstream)
    return node.vjp_from_sum(upstream, total)


class _RowSums:
    """Row sums of backward values, simplified without a pass over a full tensor where the
    math allows: sums are linear, a factor constant along the row comes out, a value
    constant along it is counted, a gather's adjoint (one value per row) sums to that
    value, and a softmax to 1; a product summed along the row in ``forward`` is forward's
    row value (entropy's ``sum(p*log p)``).

    Eagerly, a full-size adjoint whose row sum forward computed (entropy's ``-g*log p``,
    summed with ``p``) is left to the kernel (``forward`` empty): it reads the adjoint and
    the softmax in one fused pass, where the formula with the saved row value takes three
    elementwise ones."""

    def __init__(self, shapes: _Shapes, forward: frozenset, adjoints: frozenset) -> None:
        self.assumed: set = set()  # (param, dims) taken as constant along the row
        self.shapes = shapes
        self.forward = forward  # the forward nodes whose row sums count as known
        self.adjoints = adjoints

    def of(self, expr: sympy.Expr, dims: sympy.Tuple, along: sympy.Expr) -> sympy.Expr | None:
        """``sum(expr, dims)``, with ``along`` the value summed over (of full size, for its
        count), or None where it needs a pass over a full tensor backward computes."""
        if expr == 0:
            return sympy.S.Zero
        if self._constant(expr, dims):
            return expr * Count(along, dims)
        if expr.is_Add:
            terms = [self.of(term, dims, along) for term in expr.args]
            return None if any(t is None for t in terms) else sympy.Add(*terms)
        if expr.is_Mul:
            constant = [f for f in expr.args if self._constant(f, dims)]
            if constant:
                varying = self.of(sympy.Mul(*(f for f in expr.args if f not in constant)), dims, along)
                return None if varying is None else sympy.Mul(*constant) * varying
        if isinstance(expr, Scatter) and tuple(dims) == (-1,):
            return expr.args[0]  # (one nonzero per row)
        if type(expr) is Softmax and expr.dims == dims:
            return sympy.S.One
        summed = ReduceSum(expr, dims)
        if summed in self.forward and not expr.free_symbols & self.adjoints:
            return summed
        return None

    def _constant(self, expr: sympy.Expr, dims: sympy.Tuple) -> bool:
        found = self.shapes.of(expr)
        constant = found == EVERY or {int(d) for d in dims} <= found
        if constant:
            # (params read for their values, not only for sizes in a Count: assumed constant)
            counts = {c: sympy.Dummy() for c in sympy.preorder_traversal(expr) if isinstance(c, Count)}
            symbols = expr.xreplace(counts).free_symbols - self.shapes.inputs - self.adjoints
            params = {x for x in symbols if isinstance(x, sympy.Symbol) and not isinstance(x, sympy.Dummy)}
            self.assumed |= {(x, tuple(int(d) for d in dims)) for x in params}
        return constant


def _scatters_added(gradient: sympy.Expr, shapes: _Shapes) -> sympy.Expr:
    """``gradient`` with each sum of gathers' adjoints and a full-size value written as
    one ScatterAdd per class index: ``base.scatter_add(...)``, one in-row pass where the
    zero tensor of each Scatter and the add would be two full ones. Only where there is
    one input tensor, whose shape every full-size value then has (with several, the sum
    may have another one that broadcasting makes)."""
    if len(shapes.inputs) != 1:
        return gradient

    def added(node: sympy.Expr) -> sympy.Expr:
        if not node.is_Add:
            return node
        scatters = [t for t in node.args if isinstance(t, Scatter)]
        base = sympy.Add(*(t for t in node.args if not isinstance(t, Scatter)))
        if not scatters or base == 0 or shapes.of(base) != frozenset():
            return node
        for index in sorted({s.args[1] for s in scatters}, key=str):
            values = sympy.Add(*(s.args[0] for s in scatters if s.args[1] == index))
            base = ScatterAdd(base, values, index)
        return base

    return gradient.replace(lambda e: e.is_Add, added)


def _summed_to(value: sympy.Expr, node: sympy.Expr, operand: Dims, shapes: _Shapes) -> sympy.Expr:
    """An elementwise node's adjoint contribution ``value``, summed along the dims its operand
    was broadcast over (reduced in the operand, not in the node).

    ``value`` may be smaller than the node (an upstream gradient of a reduced output): along
    a dim where it is constant, the sum over the node's elements is a product with their count.
    """
    node_dims = shapes.of(node)
    if operand == node_dims:
        return value
    value_dims = shapes.of(value)
    if operand == EVERY:
        if value_dims == EVERY:
            if node_dims != EVERY and node_dims:
                raise NotImplementedError("a 0-d gradient of a value reduced along a dim, summed whole")
            return value * Count(node, WHOLE)
        constant = value_dims - (frozenset() if node_dims == EVERY else node_dims)
        summed = ReduceSum(value, WHOLE)
        return summed * Count(node, _sorted(constant)) if constant else summed
    extra = operand - (frozenset() if node_dims == EVERY else node_dims)
    if not extra:
        return value
    constant = extra if value_dims == EVERY else extra & value_dims
    varying = extra - constant
    if varying:
        value = ReduceSum(value, _sorted(varying))
    if constant:
        value = value * Count(node, _sorted(constant))
    return value


def _sorted(dims) -> sympy.Tuple:
    return dims_tuple(tuple(sorted(dims)))


def jvp(
    outputs: list[sympy.Expr], tangents: dict[sympy.Symbol, sympy.Expr], inputs: tuple[sympy.Symbol, ...]
) -> tuple[sympy.Expr, ...]:
    """Each output's tangent, by forward mode: ``tangents`` maps an input to its tangent."""
    wanted = frozenset(inputs)
    tangent: dict[sympy.Expr, sympy.Expr] = dict(tangents)
    for node in reversed(_topological(outputs)):
        if node in tangent or not (node.free_symbols & wanted):
            continue
        if isinstance(node, RowFunction):
            tangent[node] = node.jvp(tangent.get(node.operand, sympy.S.Zero))
            continue
        total = sympy.S.Zero
        for arg, partial in _partials(node):
            if arg.free_symbols & wanted:
                total += partial * tangent.get(arg, sympy.S.Zero)
        tangent[node] = total
    return tuple(tangent.get(output, sympy.S.Zero) for output in outputs)
