"""Row-wise functions: values that depend on other elements along a dim.

Each is a :class:`sympy.Function` over an operand and the dims it works along (a
``sympy.Tuple`` of ints; empty for a whole-tensor reduction). Inside an expression a
reduction keeps its dims (``keepdim=True``), so it broadcasts back against the tensor it
reduced: ``x - LogSumExp(x, (-1,))`` is ``x - torch.logsumexp(x, -1, keepdim=True)``. A
whole-tensor reduction is 0-d.

They are opaque to SymPy's calculus (``fdiff`` raises): their derivatives are not
elementwise, so :mod:`symgrad.derive.rowwise` differentiates them by their adjoint rules
(:meth:`RowFunction.vjp`, :meth:`RowFunction.jvp`), and each prints itself as one torch call
(``_symgrad_torch``, the printer's ``printmethod``).
"""

from __future__ import annotations

import ast
from typing import ClassVar

import sympy

from ..codegen.syntax import (
    Code,
    Parenthesized,
    attribute,
    binop,
    call,
    compare,
    dotted,
    method,
    number,
    parens,
    starred,
    subscript,
    tuple_of,
)

# A whole-tensor reduction's dims: every dim, and the result is 0-d.
WHOLE = sympy.Tuple()


def dims_tuple(dims: int | tuple[int, ...] | sympy.Tuple) -> sympy.Tuple:
    """``dims`` as the ``sympy.Tuple`` of Integers the classes below take."""
    if isinstance(dims, sympy.Tuple):
        return dims
    if isinstance(dims, int):
        dims = (dims,)
    return sympy.Tuple(*(sympy.Integer(d) for d in dims))


def print_dims(dims: sympy.Tuple) -> str:
    """A dims tuple as the docstring shows it: ``-1`` or ``(-2, -1)``."""
    values = [int(d) for d in dims]
    return str(values[0]) if len(values) == 1 else "(" + ", ".join(map(str, values)) + ")"


def dims_code(dims: sympy.Tuple) -> Code:
    """A dims tuple as torch's ``dim=`` argument: ``-1`` or ``(-2, -1)``."""
    values = [number(int(d)) for d in dims]
    return values[0] if len(values) == 1 else tuple_of(*values)


class RowFunction(sympy.Function):
    """A function whose value at an element depends on other elements along ``dims``."""

    # torch's name, for the docstring and the printer
    torch_name: ClassVar[str] = ""
    # Whether the result has the operand's shape (softmax) rather than a reduced one.
    keeps_shape: ClassVar[bool] = False

    @property
    def operand(self) -> sympy.Expr:
        return self.args[0]

    @property
    def dims(self) -> sympy.Tuple:
        return self.args[1]

    def fdiff(self, argindex=1):
        raise TypeError(f"{type(self).__name__} is not elementwise: differentiate it by its adjoint rule")

    def _eval_is_extended_real(self):
        return self.operand.is_extended_real

    def _eval_derivative(self, symbol):
        raise TypeError(f"{type(self).__name__} is not elementwise: differentiate it by its adjoint rule")

    def vjp(self, adjoint: sympy.Expr) -> sympy.Expr:
        """The operand's adjoint, given this node's (of this node's shape)."""
        raise NotImplementedError

    def jvp(self, tangent: sympy.Expr) -> sympy.Expr:
        """This node's tangent, given the operand's."""
        raise NotImplementedError

    def _symgrad_torch(self, printer) -> Code:
        operand = printer._print(self.operand)
        if not self.dims:
            return call(f"torch.{self.torch_name}", operand)
        return call(f"torch.{self.torch_name}", operand, dim=dims_code(self.dims), keepdim=True)

    def _sympystr(self, printer) -> str:
        name = self.torch_name.split(".")[-1]
        if not self.dims:
            return f"{name}({printer._print(self.operand)})"
        return f"{name}({printer._print(self.operand)}, {print_dims(self.dims)})"


class Reduction(RowFunction):
    """A reduction along ``dims`` (kept, of size 1), or of the whole tensor (0-d)."""

    @classmethod
    def eval(cls, operand, dims):
        if operand.is_zero and cls in (ReduceSum, ReduceMean):
            return sympy.S.Zero
        if cls is ReduceSum and isinstance(operand, Scatter) and tuple(dims) == (-1,):
            return operand.args[0]  # (one nonzero per row)
        return None

    def _eval_is_nonnegative(self):
        # A sum or mean of squares is: sqrt(sum(x**2)*sum(y**2)) then splits into
        # sqrt(sum(x**2))*sqrt(sum(y**2)), whose factors do not overflow where the product would.
        if isinstance(self, (ReduceSum, ReduceMean)):
            return self.operand.is_nonnegative
        return None


class ReduceSum(Reduction):
    torch_name = "sum"

    def vjp(self, adjoint):
        return adjoint

    def jvp(self, tangent):
        return ReduceSum(tangent, self.dims)


class ReduceMean(Reduction):
    torch_name = "mean"

    def vjp(self, adjoint):
        return adjoint / Count(self.operand, self.dims)

    def jvp(self, tangent):
        return ReduceMean(tangent, self.dims)


class _Extremum(Reduction):
    def vjp(self, adjoint):
        # Split evenly between ties, as torch's amax/amin backward does.
        at = IsEqual(self.operand, self)
        return adjoint * at / ReduceSum(at, self.dims)

    def jvp(self, tangent):
        at = IsEqual(self.operand, self)
        return ReduceSum(at * tangent, self.dims) / ReduceSum(at, self.dims)


class ReduceMax(_Extremum):
    torch_name = "amax"


class ReduceMin(_Extremum):
    torch_name = "amin"


class LogSumExp(Reduction):
    """log(sum(exp(e))) along ``dims``, as torch's max-shifted kernel computes it."""

    torch_name = "logsumexp"

    def vjp(self, adjoint):
        return adjoint * self.weights()

    def jvp(self, tangent):
        return ReduceSum(self.weights() * tangent, self.dims)

    def weights(self) -> sympy.Expr:
        """d(logsumexp)/d(e): softmax along one dim, one fused kernel (on a CPU about half
        the time of exp(e - lse), two passes); exp(e - lse) along several."""
        if len(self.dims) == 1:
            return Softmax(self.operand, self.dims)
        return sympy.exp(self.operand - self)

    def _symgrad_torch(self, printer) -> Code:
        operand = printer._print(self.operand)
        if not self.dims:
            # (torch.logsumexp needs a dim: the flattened tensor's only one gives a 0-d result)
            return call("torch.logsumexp", method(operand, "flatten"), 0)
        return call("torch.logsumexp", operand, dim=dims_code(self.dims), keepdim=True)


class Norm(Reduction):
    """The 2-norm along ``dims``."""

    torch_name = "linalg.vector_norm"

    def vjp(self, adjoint):
        # 0 on a row that is all zeros (padding), as torch's vector_norm gives, not 0/0
        return adjoint * self._direction(self.operand)

    def jvp(self, tangent):
        return ReduceSum(self._direction(self.operand) * tangent, self.dims)

    def _direction(self, operand: sympy.Expr) -> sympy.Expr:
        return sympy.Piecewise((sympy.S.Zero, sympy.Eq(self, 0)), (operand / self, True))

    def _sympystr(self, printer) -> str:
        if not self.dims:
            return f"norm({printer._print(self.operand)})"
        return f"norm({printer._print(self.operand)}, {print_dims(self.dims)})"


class Softmax(RowFunction):
    """exp(e - logsumexp(e)) along one dim."""

    torch_name = "softmax"
    keeps_shape = True

    def vjp(self, adjoint):
        # y*(g - sum(g*y)) in ATen's one fused pass (differentiable: double backward works)
        return SoftmaxBackward(adjoint, self, self.dims, sympy.S.Zero)

    def summed_in_vjp(self, adjoint: sympy.Expr) -> sympy.Expr:
        """What the VJP sums along the dim: ``g*y``."""
        return adjoint * self

    def vjp_from_sum(self, adjoint: sympy.Expr, total: sympy.Expr) -> sympy.Expr:
        """The VJP as its formula, given ``total``, the row sum of :meth:`summed_in_vjp`:
        ``y*(g - total)``, with the factors that ``g`` and ``total`` share taken out."""
        return self * sympy.factor_terms(adjoint - total)

    def jvp(self, tangent):
        return self * (tangent - ReduceSum(tangent * self, self.dims))

    def _symgrad_torch(self, printer) -> Code:
        return call(f"torch.{self.torch_name}", printer._print(self.operand), dims_code(self.dims))


class LogSoftmax(Softmax):
    """e - logsumexp(e) along one dim."""

    torch_name = "log_softmax"

    def vjp(self, adjoint):
        # g - softmax*sum(g) in ATen's one fused pass, from the log_softmax output
        return SoftmaxBackward(adjoint, self, self.dims, sympy.S.One)

    def summed_in_vjp(self, adjoint: sympy.Expr) -> sympy.Expr:
        """What the VJP sums along the dim: ``g``."""
        return adjoint

    def vjp_from_sum(self, adjoint: sympy.Expr, total: sympy.Expr) -> sympy.Expr:
        """The VJP as its formula, given ``total``, the row sum of ``g``: ``g - softmax*total``."""
        return adjoint - Softmax(*self.args) * total

    def jvp(self, tangent):
        return tangent - ReduceSum(Softmax(*self.args) * tangent, self.dims)


class BackwardValue(sympy.Function):
    """A real value that backward, or a body's printed form, computes: printed, never
    differentiated symbolically (double backward differentiates the printed code)."""

    def fdiff(self, argindex=1):
        raise TypeError(f"{type(self).__name__} is a backward value: it is not differentiated symbolically")

    def _eval_is_extended_real(self):
        return True


class SoftmaxBackward(BackwardValue):
    """The VJP of a softmax or log_softmax ``y`` for the adjoint ``g``: ATen's
    ``_softmax_backward_data`` / ``_log_softmax_backward_data``, one fused pass. Args: g,
    y (the value, or the saved output's symbol), dims, 1 for log_softmax else 0."""

    def formula(self) -> sympy.Expr:
        adjoint, y, dims, log = self.args
        if log:
            return adjoint - sympy.exp(y) * ReduceSum(adjoint, dims)
        return y * (adjoint - ReduceSum(adjoint * y, dims))

    def _symgrad_torch(self, printer) -> Code:
        adjoint, y, dims, log = self.args
        kernel = "_log_softmax_backward_data" if log else "_softmax_backward_data"
        # (input_dtype: the dtype of the tensor the softmax was taken of, its input's)
        leaves = _leaves(y, frozenset())
        dtype = attribute(leaves[0].name, "dtype") if leaves else attribute(printer._print(y), "dtype")
        return call(f"torch.ops.aten.{kernel}", printer._print(adjoint), printer._print(y), dims_code(dims), dtype)

    def _sympystr(self, printer) -> str:
        return printer._print(self.formula())


class AdjointShapedAs(BackwardValue):
    """A softmax's adjoint ``g`` in the shape of the softmax's value ``y``, as ATen's
    backward kernels need it (they do not broadcast): expanded where ``g`` was reduced
    (``sum(log_softmax(x, -1), -1)``), summed where ``y`` was broadcast further on
    (``log_softmax(w, -1)*x`` with ``w`` of shape ``(H,)``); both exact, as the VJP is
    linear in ``g``. Printed as the module helper ``_reduced_to(g, y.shape)``. Args: g, y."""

    def _symgrad_torch(self, printer) -> Code:
        adjoint, y = self.args
        return call("_reduced_to", printer._print(adjoint), attribute(printer._print(y), "shape"))

    def _sympystr(self, printer) -> str:
        return printer._print(self.args[0])


class Gather(RowFunction):
    """The element of ``e`` that the integer tensor ``t`` picks along the last dim (kept)."""

    torch_name = "gather"

    @property
    def dims(self) -> sympy.Tuple:
        return sympy.Tuple(sympy.Integer(-1))

    @property
    def index(self) -> sympy.Expr:
        return self.args[1]

    def vjp(self, adjoint):
        return Scatter(adjoint, self.index, self._shaped_like())

    def _shaped_like(self) -> sympy.Expr:
        """A value of the operand's shape for the scatter's zeros: the one input the operand
        broadcasts from, unreduced (a name, which CSE leaves alone), else the operand itself
        (``gather(x*w, t)`` with ``w`` of shape ``(H,)``: neither input has its shape)."""
        leaves = _leaves(self.operand, frozenset())
        if len(leaves) == 1 and not leaves[0].gathered and not leaves[0].reduced:
            return next(s for s in self.operand.free_symbols if str(s) == leaves[0].name)
        return self.operand

    def jvp(self, tangent):
        return Gather(tangent, self.index)

    def _symgrad_torch(self, printer) -> Code:
        # (the module helper checks the index's shape, which torch.gather does not)
        return call("_gather_last", printer._print(self.operand), printer._print(self.index))

    def _sympystr(self, printer) -> str:
        return f"gather({printer._print(self.operand)}, {printer._print(self.index)})"


class Chunk(RowFunction):
    """The ``i``-th of ``n`` equal chunks of an input along its last dim.

    Printed through ``unflatten``, which refuses a last dim that ``n`` does not divide (where
    ``torch.chunk`` would make the last chunk shorter)."""

    torch_name = "chunk"
    keeps_shape = True  # (no dim reduced; the last is n times shorter)

    @property
    def dims(self) -> sympy.Tuple:
        return sympy.Tuple(sympy.Integer(-1))

    @property
    def count(self) -> int:
        return int(self.args[1])

    @property
    def index(self) -> int:
        return int(self.args[2])

    def jvp(self, tangent):
        return Chunk(tangent, *self.args[1:])

    def _symgrad_torch(self, printer) -> Code:
        chunks = method(printer._print(self.operand), "unflatten", -1, tuple_of(self.count, -1))
        # (Ellipsis and a full slice: syntax has no builders of their own)
        return subscript(chunks, tuple_of(ast.Constant(...), self.index, ast.Slice()))

    def _sympystr(self, printer) -> str:
        return f"chunk({printer._print(self.operand)}, {self.count}, {self.index})"


class ChunkCat(sympy.Function):
    """The ``n`` chunks' gradients side by side along the last dim (a chunk no output reads
    gets zeros): the gradient of the input they were cut from."""

    def _symgrad_torch(self, printer) -> Code:
        pieces = [printer._print(a) if a != 0 else None for a in self.args]
        like = next(p for p in pieces if p is not None)
        filled = [p if p is not None else call("torch.zeros_like", like) for p in pieces]
        return call("torch.cat", tuple_of(*filled), -1)

    def _sympystr(self, printer) -> str:
        return f"cat({', '.join(printer._print(a) for a in self.args)})"


class Count(sympy.Function):
    """How many elements of ``e`` a reduction along ``dims`` takes (a Python int at run time).

    Printed from the shapes of the tensors ``e`` is computed from (:func:`_leaves`): those
    reduced along the fewest dims decide, and negative dims align the trailing dims, so each
    of them has the reduced dim's size there, or 1 where it broadcasts.
    """

    is_integer = True
    is_positive = True

    def _symgrad_torch(self, printer) -> Code:
        operand, dims = self.args
        leaves = _leaves(operand, frozenset())
        if not leaves:
            return number(1)
        fewest = min((leaf.reduced for leaf in leaves), key=lambda d: (len(d), sorted(d)))
        deciding = sorted({leaf for leaf in leaves if leaf.reduced == fewest}, key=lambda leaf: leaf.name)
        if len(deciding) == 1 and deciding[0].gathered and not dims and not fewest:
            return method(deciding[0].name, "numel")  # (one value per row of the gather's index)
        shapes = [leaf.shape for leaf in deciding]
        shape = shapes[0] if len(shapes) == 1 else call("torch.broadcast_shapes", *shapes)
        if not dims:
            alone = len(deciding) == 1 and not deciding[0].gathered
            total = method(deciding[0].name, "numel") if alone else method(call("torch.Size", shape), "numel")
            reduced = [subscript(shape, d) for d in sorted(fewest)]
            return total if not reduced else _binary_chain(total, "//", [_product(reduced)])
        sizes = [subscript(shape, int(d)) for d in dims if int(d) not in fewest]
        return _product(sizes) if sizes else number(1)

    def _sympystr(self, printer) -> str:
        return f"count({printer._print(self.args[0])}, {print_dims(self.args[1])})"


class KeptShape(sympy.Symbol):
    """The shape of an input that backward reads only in a Count (``mean(x, -1)``'s
    ``1/H``), named as the code holds it: ``ctx.x_shape``, or ``x_shape`` in ``--fuse``'s
    pure bodies. Standing for the input there, it lets backward save a shape, not a tensor,
    as autograd's MeanBackward does."""


class _Leaf(tuple):
    """A tensor a value is computed from: its name, whether it is a gather's index (whose
    gathered dim has size 1), the dims reductions took on the way, and whether the name is
    of a kept shape (KeptShape) rather than of the tensor."""

    name = property(lambda self: self[0])
    gathered = property(lambda self: self[1])
    reduced = property(lambda self: self[2])
    kept = property(lambda self: self[3])

    @property
    def shape(self) -> Code:
        if self.kept:
            return dotted(self.name)
        shape = attribute(self.name, "shape")
        return tuple_of(starred(shape), 1) if self.gathered else shape


def _leaves(expr: sympy.Basic, reduced: frozenset) -> list[_Leaf]:
    """The tensors ``expr``'s value broadcasts from (whole-tensor reductions and params that
    may be numbers, Dummies here, contribute none)."""
    if isinstance(expr, Gather):
        return [_Leaf((str(expr.index), True, reduced, False))]
    if isinstance(expr, Reduction):
        if not expr.dims:
            return []
        return _leaves(expr.operand, reduced | frozenset(int(d) for d in expr.dims))
    if isinstance(expr, sympy.Dummy):
        return []
    if isinstance(expr, sympy.Symbol):
        return [_Leaf((str(expr), False, reduced, isinstance(expr, KeptShape)))]
    found = []
    for arg in expr.args:
        if isinstance(arg, sympy.Basic) and not isinstance(arg, sympy.Tuple):
            found += _leaves(arg, reduced)
    return found


class Scatter(sympy.Function):
    """``a`` (one value per row) at the class ``t`` picks along the last dim, 0 elsewhere, in
    a tensor shaped like ``like``: the gradient of a gather."""

    def fdiff(self, argindex=1):
        raise TypeError("Scatter is not elementwise")

    def _symgrad_torch(self, printer) -> Code:
        values, index, like = self.args
        anchor = printer._print(like)
        index_code = printer._print(index)
        expanded = method(printer._print(values), "expand", starred(attribute(index_code, "shape")), 1)
        return method(call("torch.zeros_like", anchor), "scatter", -1, method(index_code, "unsqueeze", -1), expanded)

    def _sympystr(self, printer) -> str:
        return f"scatter({printer._print(self.args[0])}, {printer._print(self.args[1])})"


class ScatterAdd(BackwardValue):
    """``base`` plus ``a`` (one value per row) at the class ``t`` picks along the last dim:
    a gather's gradient added to a full-size one in an in-row pass (``scatter_add``), where
    :class:`Scatter` would write a zero tensor first and an add would read it again.
    Args: base (of full size), a, t.

    Printed as the module helper ``_scatter_added``, which adds in place (the out-of-place
    form copies the whole tensor first): into ``base`` where it prints as arithmetic, a
    fresh tensor that no other name refers to and that autograd does not read; into the
    output of the softmax in ``softmax*scale + shift``, which the helper scales and shifts
    in place too; else into a clone of ``base``."""

    def _symgrad_torch(self, printer) -> Code:
        base, values, index = self.args
        index_code = printer._print(index)
        expanded = method(printer._print(values), "expand", starred(attribute(index_code, "shape")), 1)
        index_code = method(index_code, "unsqueeze", -1)
        affine = _softmax_affine(base)
        if affine is not None:
            softmax, scale, shift = affine
            terms = {"scale": scale, "shift": shift}
            given = {key: printer._print(value) for key, value in terms.items() if value is not None}
            return call("_scatter_added", printer._print(softmax), index_code, expanded, **given)
        base_code = printer._print(base)
        bare = base_code.value if isinstance(base_code, Parenthesized) else base_code
        fresh = isinstance(bare, ast.BinOp) and not isinstance(bare.op, ast.Pow)  # (pow's backward reads its result)
        fresh = fresh or (isinstance(bare, ast.UnaryOp) and isinstance(bare.op, ast.USub))
        return call("_scatter_added", base_code if fresh else method(base_code, "clone"), index_code, expanded)

    def _sympystr(self, printer) -> str:
        base, values, index = self.args
        return f"{printer._print(base)} + scatter({printer._print(values)}, {printer._print(index)})"


def _softmax_affine(base: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr | None, sympy.Expr | None] | None:
    """``base`` as ``(softmax, scale, shift)`` where it is ``softmax*scale + shift`` (None
    for a scale of 1 or a shift of 0) with one softmax or log_softmax node read once, else
    None."""
    terms = sympy.Add.make_args(base)
    with_softmax = [t for t in terms if any(isinstance(f, Softmax) for f in sympy.Mul.make_args(t))]
    if len(with_softmax) != 1:
        return None
    factors = list(sympy.Mul.make_args(with_softmax[0]))
    softmax = next(f for f in factors if isinstance(f, Softmax))
    factors.remove(softmax)
    scale = sympy.Mul(*factors)
    shift = sympy.Add(*(t for t in terms if t is not with_softmax[0]))
    reads = sum(1 for node in sympy.preorder_traversal(base) if node == softmax)
    if reads != 1 or (scale == 1 and shift == 0):
        return None
    return softmax, None if scale == 1 else scale, None if shift == 0 else shift


class IsEqual(sympy.Function):
    """1 where ``a == b`` else 0 (a bool tensor, which arithmetic promotes)."""

    is_nonnegative = True

    def fdiff(self, argindex=1):
        return sympy.S.Zero

    def _symgrad_torch(self, printer) -> Code:
        return parens(compare(printer._print(self.args[0]), "==", printer._print(self.args[1])))


def _product(factors: list) -> Code:
    product = factors[0]
    for factor in factors[1:]:
        product = binop(product, "*", factor)
    return product if len(factors) == 1 else parens(product)


def _binary_chain(first, op: str, rest: list) -> Code:
    result = first
    for item in rest:
        result = binop(result, op, item)
    return result


def is_rowwise(expr: sympy.Basic) -> bool:
    """Whether ``expr`` has a row-wise function anywhere."""
    return any(isinstance(node, RowFunction) for node in sympy.preorder_traversal(expr))
