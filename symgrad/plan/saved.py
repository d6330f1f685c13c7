"""What backward and jvp save, and the setup_context that saves it.

Like PyTorch's ``derivatives.yaml`` (``exp: grad * result``), a gradient may be written in
terms of the output where that is exact and saves fewer tensors or operations; only
inputs, outputs and number params are ever saved, never a forward intermediate (which
would make double backward silently wrong).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy

from ..derive import Derivation
from ..math.simplify import op_count
from ..codegen.syntax import Code, attribute, call, compare, if_else, method, name, source, starred, string, tuple_of
from .code import unpack_target
from .ir import Assign, Comment, Line, Method, Pass, Statement, Unpack, render_statements
from .names import Names


def choose_saved_forms(
    derivation: Derivation, names: Names, avoid_results: bool = False
) -> list[tuple[sympy.Expr, ...]] | None:
    """Per output, the gradient row to print: in terms of inputs, or of the output.

    A row may be rewritten in terms of its own output when that is exact (a structural
    substitution) and cheaper. The choice that saves the fewest tensors, then costs the
    fewest operations, wins. With ``avoid_results``, the cheapest that saves no output and
    no more tensors than that winner; None where there is none, or where it is the winner
    already.
    """
    parsed = derivation.parsed
    options = []
    for index, (out, row) in enumerate(zip(parsed.outputs, derivation.gradients)):
        choices = [row]
        forward = derivation.forward[index]
        if out.reduction is None and not forward.is_Symbol:
            substituted = tuple(g.subs(forward, names.results[index]) for g in row)
            if substituted != row:
                choices.append(substituted)
        options.append(choices)
    tensors = set(parsed.inputs) | set(names.results)
    # In place, saving the overwritten input means saving a copy of it, which also
    # loses double backward: avoid that first.
    overwritten = set(parsed.inputs[:1]) if parsed.spec.inplace else set()

    def cost(rows: tuple[tuple[sympy.Expr, ...], ...]) -> tuple[int, int, int]:
        used = set().union(*(g.free_symbols for row in rows for g in row)) & tensors
        return len(used & overwritten), len(used), sum(op_count(g) for row in rows for g in row)

    choices = list(itertools.product(*options))
    best = min(choices, key=cost)
    if not avoid_results:
        return list(best)
    without = [rows for rows in choices if not any(g.has(*names.results) for row in rows for g in row)]
    best_without = min(without, key=cost) if without else None
    if best_without is None or best_without == best or cost(best_without)[:2] > cost(best)[:2]:
        return None
    return list(best_without)


class Saving:
    """What one plan saves, and the statements that save and unpack it (``builder``:
    :class:`~.bodies.Builder`, whose names and rows it reads)."""

    def __init__(self, builder) -> None:
        self.b = builder

    def saved(self) -> list[sympy.Symbol]:
        used = set().union(*(g.free_symbols for row in self.b.live_rows() for g in row))
        order = list(self.b.inputs) + list(self.b.names.results)
        return [s for s in order if s in used]

    def saved_params(self) -> list[sympy.Symbol]:
        used = set().union(*(g.free_symbols for row in self.b.live_rows() for g in row))
        return [s for s in self.b.params if s in used]

    def inplace_readers(self) -> dict[str, tuple[int, ...]]:
        """For an in-place Function: each input after the first and each param that backward
        reads, with the inputs whose gradients read it."""
        b = self.b
        kept = [s for s in self.saved() if s in b.inputs[1:]] + self.saved_params()
        return {
            b.name(s): tuple(j for j in range(len(b.inputs)) if any(s in row[j].free_symbols for row in b.live_rows()))
            for s in kept
        }

    def whole(self, saved: list[sympy.Symbol]) -> Code | None:
        """``*inputs`` or ``output`` where ``saved`` is exactly that and nothing else needs
        their names (no number params, shapes or marked outputs); else None."""
        b = self.b
        plain = not self.saved_params() and not b.broadcasts and all(b.live) and not b.p.spec.fast
        if not plain or any(out.reduction for out in b.outputs):
            return None
        if saved == list(b.inputs):
            return starred(name("inputs"))
        if b.n_out == 1 and saved == list(b.names.results):
            return name("output")
        return None

    def setup_context(self, saved: list[sympy.Symbol]) -> Method:
        b = self.b
        whole = self.whole(saved)
        if whole is not None and not b.speed:
            return Method(("ctx", "inputs", "output"), (Line(method("ctx", "save_for_backward", whole)),))
        body: list[Statement] = []
        uses_inputs = (
            any(s in b.inputs for s in saved)
            or self.saved_params()
            or b.broadcasts
            or any(out.reduction and live for out, live in zip(b.outputs, b.live))
        )
        if uses_inputs:
            body.append(Assign(unpack_target(b.forward_params()), name("inputs")))
        results = [b.name(r) for r in b.names.results]
        elementwise_shapes = b.broadcasts and any(
            out.reduction is None and live for out, live in zip(b.outputs, b.live)
        )
        if any(r in saved for r in b.names.results) or not all(b.live) or elementwise_shapes:
            body.append(Assign(unpack_target(results) if b.n_out > 1 else results[0], name("output")))
        dead = [results[i] for i, live in enumerate(b.live) if not live]
        if dead:
            body.append(Comment("Piecewise constant in every input: the derivative is zero almost everywhere."))
            body.append(Line(method("ctx", "mark_non_differentiable", *dead)))
        body += self.shape_lines()
        body += self.save_lines("save_for_backward", saved)
        if b.speed:
            body.append(Comment("An output that gets no gradient (a derivative, outside double backward) gets None."))
            body.append(Line(method("ctx", "set_materialize_grads", False)))
        elif b.upstream_may_be_none:
            body.append(Comment("An output the caller leaves unused gets None, and its terms are skipped."))
            body.append(Line(method("ctx", "set_materialize_grads", False)))
        return Method(("ctx", "inputs", "output"), tuple(body or [Pass()]))

    def shape_attr(self, output: int) -> str:
        """The ctx attribute with output ``output``'s shape; for a reduction, the shape of
        the elementwise expression it reduces."""
        result = self.b.name(self.b.names.results[output])
        return f"{result}_elementwise_shape" if self.b.outputs[output].reduction else f"{result}_shape"

    def shape_lines(self) -> list[Statement]:
        b = self.b
        body: list[Statement] = []
        if b.broadcasts:
            for symbol in b.inputs:
                body.append(Assign(f"ctx.{b.name(symbol)}_shape", attribute(b.name(symbol), "shape")))
        for index, out in enumerate(b.outputs):
            if not b.live[index]:
                continue
            result = b.name(b.names.results[index])
            if out.reduction is not None:
                tensors = sorted(out.expr.free_symbols, key=lambda s: (b.inputs + b.params).index(s))
                shapes = [
                    attribute(b.name(s), "shape")
                    if s in b.inputs
                    else call("getattr", b.name(s), string("shape"), tuple_of())
                    for s in tensors
                ]
                body.append(Assign(f"ctx.{self.shape_attr(index)}", call("torch.broadcast_shapes", *shapes)))
            elif b.broadcasts:
                body.append(Assign(f"ctx.{result}_shape", attribute(result, "shape")))
        return body

    def save_parts(
        self, ctx_method: str, saved_names: list[str], params: Sequence[sympy.Symbol] | None = None
    ) -> tuple[list[Statement], list[Code]]:
        """Statements that stash number params (default: saved_params) on ctx, and the tensors
        ``ctx_method`` saves."""
        body: list[Statement] = []
        tensors: list[Code] = [name(n) for n in saved_names]
        for param in self.saved_params() if params is None else params:
            param_name = self.b.name(param)
            number = f"ctx.{param_name}_number"
            if ctx_method == "save_for_backward":
                is_tensor = call("isinstance", param_name, "torch.Tensor")
                body.append(Assign(number, if_else(is_tensor, None, param_name)))
            tensors.append(if_else(compare(number, "is", None), param_name, None))
        return body, tensors

    def save_lines(self, ctx_method: str, saved: list[sympy.Symbol]) -> list[Statement]:
        body, tensors = self.save_parts(ctx_method, [self.b.name(s) for s in saved])
        if tensors:
            body.append(Line(method("ctx", ctx_method, *tensors)))
        return body

    def unpack_saved(
        self, saved: Sequence[sympy.Symbol], params: Sequence[sympy.Symbol] | None = None
    ) -> Unpack | None:
        """Unpacking ctx.saved_tensors: ``saved``, then the params (default: saved_params), a
        number param from its ctx attribute."""
        params = self.saved_params() if params is None else params
        names = tuple(self.b.name(s) for s in saved) + tuple(self.b.name(p) for p in params)
        if not names:
            return None
        return Unpack(names, tuple(self.b.name(p) for p in params))

    def setup_forward_ad(self, saved: list[sympy.Symbol]) -> tuple[str, ...]:
        b = self.b
        whole = self.whole(saved)
        if whole is not None and b.single_tangent():
            return (source(method("ctx", "save_for_forward", whole)),)
        body = self.save_lines("save_for_forward", saved)
        results = [b.name(r) for r in b.names.results]
        # With several tangents, an output none of the given ones reaches gets a zero tangent
        # of its own dtype (not the inputs': float16 x and float32 y give a float32 output).
        dtypes: list[Statement] = (
            []
            if b.single_tangent()
            else [
                Assign(f"ctx.{results[i]}_dtype", attribute(results[i], "dtype"))
                for i in range(b.n_out)
                if b.live[i]
            ]
        )
        if not body and not dtypes:
            return ()
        unpack: list[Statement] = []
        if any(s in b.inputs for s in saved) or self.saved_params():
            unpack.append(Assign(unpack_target(b.forward_params()), name("inputs")))
        if any(r in saved for r in b.names.results) or dtypes:
            unpack.append(Assign(unpack_target(results) if b.n_out > 1 else results[0], name("output")))
        return tuple(render_statements(unpack + dtypes + body))
