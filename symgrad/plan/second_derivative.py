"""Double backward's own Function, where autograd's derivative of a gradient formula is
nan or inaccurate and the symbolic second derivative is not (:class:`~.ir.SecondDerivative`).
"""

from __future__ import annotations

import sympy

from ..derive import autograd_loses_second_derivatives, exact_second_derivatives
from ..errors import SymgradError
from ..math.numbers import numbers_to_floats
from ..codegen.syntax import (
    NONE,
    Code,
    attribute,
    call,
    compare,
    generator,
    method,
    name,
    parens,
    starred,
    string,
    subscript,
    tuple_of,
)
from .code import sum_of, sum_of_present, times_upstream, unpack_target, with_helpers
from .ir import Assign, Comment, CreateGraphBranch, If, Line, Method, Return, SecondDerivative, Statement
from .names import derivative_class

_SECOND_DERIVATIVE_COMMENT = (
    "Double backward: the derivative's own Function, whose backward is exact (autograd's",
    "derivative of the formula is nan or inexact somewhere the math is finite).",
)


class SecondDerivatives:
    """Builds the SecondDerivative Function and backward's branch that calls it
    (``builder``: :class:`~.bodies.Builder`)."""

    def __init__(self, builder) -> None:
        self.b = builder

    def param_samples(self) -> dict[sympy.Symbol, float]:
        """Each param's sample value: the tests' (in the metadata), and where the
        second-derivative probe fixes params."""
        domain = {s: (lo, hi) for s, lo, hi in self.b.d.domain}
        return {p: round(domain[p][0] + 0.618 * (domain[p][1] - domain[p][0]), 3) for p in self.b.params}

    def function(self, entries: list[tuple[int, int]], exprs: list[sympy.Expr]) -> SecondDerivative | None:
        """Double backward's own Function, where autograd's derivative of some create_graph
        formula ``exprs[k]`` (of gradient ``entries[k]``) is nan or inaccurate and symbolic
        second derivatives are not (derive); else None.

        Its outputs are the gradients' derivatives d(result)/d(input), one per (output,
        input) pair, and params pass through it undifferentiated. It leaves out the gradients
        whose own derivatives are all 0 (a constant, sign(x)): autograd's derivative of those
        is exact, and a Function output that no input moves would have no tangent of its
        shape. Not in place, nor with a surrogate (whose derivative is declared, not derived).
        """
        b = self.b
        if b.p.spec.inplace or any(b.d.surrogate):
            return None
        gradients = [b.d.gradients[i][j] for i, j in entries]
        raws = [b.d.raw_gradients[i][j] for i, j in entries]
        # autograd differentiates the outputs through this Function's own backward: the gradients.
        restored = dict(zip(b.names.results, b.d.forward))
        # The probe covers three symbols at most. Params beyond that are probed at their sample
        # values (log(1+exp(a*x*y+b)): at a = b = 0.708), not left unprobed.
        symbols_used = set().union(*(raw.free_symbols for raw in raws)) & set(b.inputs + b.params)
        fixed = {}
        if len(symbols_used) > 3:
            # (Rational: exp(0.708) as a 15-digit Float would spoil the exact reference.)
            fixed = {p: sympy.Rational(str(v)) for p, v in self.param_samples().items() if p in symbols_used}
        try:
            if not any(
                autograd_loses_second_derivatives(expr.xreplace(restored), raw, b.inputs, fixed)
                for expr, raw in zip(exprs, raws)
            ):
                return None
            varying = [k for k, g in enumerate(gradients) if numbers_to_floats(g).free_symbols & set(b.inputs)]
            used = set().union(*(gradients[k].free_symbols | raws[k].free_symbols for k in varying))
            symbols = tuple(s for s in b.inputs if s in used)
            saving = b.saving
            if not set(symbols) <= set(saving.saved()) or not used & set(b.params) <= set(saving.saved_params()):
                b.second_derivative_needs_inputs = True
                return None  # backward has not got them (it saved the output instead)
            identities: set[str] = set()
            # (Params are probed as the inputs are, but not differentiated by.)
            hessian = {k: exact_second_derivatives(raws[k], gradients[k], symbols, identities, fixed) for k in varying}
        except SymgradError:
            return None  # SymPy cannot differentiate it again: autograd differentiates the formula
        if any(row is None for row in hessian.values()):
            return None
        covered = [k for k in varying if any(h != 0 for h in hessian[k])]
        if not covered:
            return None
        # The inputs and params that the derivatives it returns depend on.
        needed = set().union(*(gradients[k].free_symbols | raws[k].free_symbols for k in covered))
        kept = [n for n, s in enumerate(symbols) if s in needed]
        b.second_identities = identities
        return self.methods(
            [entries[k] for k in covered],
            tuple(symbols[n] for n in kept),
            tuple(p for p in b.params if p in needed),
            [gradients[k] for k in covered],
            [tuple(hessian[k][n] for n in kept) for k in covered],
        )

    def methods(self, entries, symbols, params, gradients, hessian) -> SecondDerivative:
        """SecondDerivative's methods, with ``symbols`` as its inputs and ``params`` after
        them: forward returns d(result i)/d(input j) for each (i, j) in ``entries``
        (``gradients``); backward and jvp multiply by ``hessian`` (row k holds the derivatives
        of ``gradients[k]`` by each of ``symbols``)."""
        b = self.b
        inputs = [b.name(s) for s in symbols]
        param_names = [b.name(p) for p in params]
        # Several tensors broadcast: each gradient is reduced to its input's shape, and a
        # tangent may be None.
        several = len(inputs) + len(param_names) > 1
        derivatives = [b.names.namer.claim(f"d{b.name(b.names.results[i])}_d{b.name(b.inputs[j])}") for i, j in entries]
        cotangents = tuple(b.names.namer.claim(f"grad_{d}") for d in derivatives)
        unpack = b.saving.unpack_saved(symbols, params)
        hessian_entries = [h for row in hessian for h in row]

        def body(
            exprs: list[sympy.Expr], reference: str
        ) -> tuple[list[Statement], list[Code], list[sympy.Expr], frozenset[str]]:
            """Statements, the printed values, the expressions they print, and their helpers."""
            b.reference = reference  # (a float tensor in scope, for the printer)
            temps, reduced = b.cse(exprs)
            statements = b.tensorize(exprs, reference) + [b.assign(t, e) for t, e in temps]
            return statements, [b.code(e) for e in reduced], reduced, b.helpers(*reduced)

        def product(factor_name: str, k: int, j: int) -> Code:
            entry = k * len(inputs) + j
            return times_upstream(name(factor_name), values[entry], printed[entry])

        statements, values, printed, helpers = body(gradients, inputs[0])
        returned = []
        for k, (value, gradient) in enumerate(zip(values, gradients)):
            # A new tensor each: forward-mode AD and torch.compile need that (dx of x*y is y).
            if gradient.is_Symbol or printed[k] in printed[:k]:
                value = method(value, "clone")
            returned.append(value)
        forward = Method(tuple(inputs + param_names), tuple(statements), tuple(returned), value_helpers=helpers)

        # With several derivatives a cotangent may be None (a Hessian row of its own, or
        # torch.func.jacrev of one gradient), and with several inputs a tangent may be: their
        # terms are skipped, not multiplied as zeros, which would make 0*inf = nan where a
        # second derivative overflows.
        optional_cotangents = len(derivatives) > 1
        if param_names:
            # A number param is kept on ctx; save_for_backward takes tensors only.
            stash, tensors = b.saving.save_parts("save_for_backward", inputs, params)
            setup: list[Statement] = [Assign(unpack_target(inputs + param_names), name("inputs")), *stash]
        else:
            tensors = [starred("inputs")]
            setup = []
        setup += [Line(method("ctx", "save_for_backward", *tensors)), Line(method("ctx", "save_for_forward", *tensors))]
        if several:
            # (For jvp: the zero tangent of a derivative that no given tangent reaches.)
            dtypes = call("tuple", generator(attribute("d", "dtype"), "d", "output")) if optional_cotangents else parens(tuple_of(attribute("output", "dtype")))
            setup.append(Assign("ctx.dtypes", dtypes))
        if optional_cotangents:
            setup.append(Line(method("ctx", "set_materialize_grads", False)))
        setup_context = Method(("ctx", "inputs", "output"), tuple(setup))
        term = b.term() if several or optional_cotangents else None

        statements, values, printed, helpers = body(hessian_entries, inputs[0])
        grads = []
        for j, symbol in enumerate(symbols):
            grad = b.names.grads[b.inputs.index(symbol)]
            reaching = [k for k in range(len(cotangents)) if hessian[k][j] != 0]
            if not reaching:
                grads.append(NONE)
                continue
            if not (several or optional_cotangents):
                grads.append(product(cotangents[reaching[0]], reaching[0], j))
                continue
            added = {k: product(cotangents[k], k, j) for k in reaching}
            if several:
                shape = attribute(inputs[j], "shape")
                added = {k: method(parens(code), "sum_to_size", shape) for k, code in added.items()}
            if optional_cotangents:
                unset, *summed = sum_of_present(grad, [(cotangents[k], added[k]) for k in reaching], term)
            else:  # (one cotangent, never None)
                unset, summed = Assign(grad, NONE), [Assign(grad, added[reaching[0]])]
            needs = subscript("ctx.needs_input_grad", j)
            statements += [unset, If(needs, tuple(with_helpers(summed, helpers)))]
            grads.append(name(grad))
        grads += [NONE] * len(param_names)
        backward = Method(("ctx",) + cotangents, tuple(statements), tuple(grads), unpack=unpack, value_helpers=helpers)

        everything = b.inputs + b.params
        tangents = tuple(b.names.tangents[everything.index(s)] for s in symbols + params)
        statements, values, printed, helpers = body(hessian_entries, inputs[0])
        pushed = []
        for k, gradient in enumerate(gradients):
            moving = [j for j in range(len(symbols)) if hessian[k][j] != 0]
            needed = [s for s in symbols + params if s in gradient.free_symbols]
            shapes = [
                attribute(b.name(s), "shape") if s in symbols else call("getattr", b.name(s), string("shape"), tuple_of())
                for s in needed
            ]
            if not several:
                pushed.append(product(tangents[0], k, 0))
                continue
            tangent = b.names.namer.claim(f"{derivatives[k]}_tangent")
            statements += with_helpers(
                sum_of_present(tangent, [(tangents[j], product(tangents[j], k, j)) for j in moving], term), helpers
            )
            zero = call("torch.zeros", tuple_of(), dtype=subscript("ctx.dtypes", k), device=attribute(inputs[0], "device"))
            statements += [
                If(compare(tangent, "is", None), (Assign(tangent, zero),)),
                # A term may not have the derivative's shape: it varies with another input
                # piecewise-constantly (sign(y)), or that input's tangent was None.
                Assign(tangent, method(tangent, "expand", call("torch.broadcast_shapes", *shapes))),
            ]
            pushed.append(name(tangent))
        jvp = Method(("ctx",) + tangents, tuple(statements), tuple(pushed), unpack=unpack, value_helpers=helpers)
        return SecondDerivative(
            class_name=derivative_class(b.p.spec.name),
            inputs=tuple(inputs),
            params=tuple(param_names),
            entries=tuple(entries),
            derivatives=tuple(derivatives),
            forward=b.eager(forward),
            setup_context=setup_context,
            backward=b.eager(backward, differentiating=True, gradients=cotangents),
            jvp=b.eager(jvp, differentiating=True),
        )

    def create_graph_branch(self, entries: list[tuple[int, int]], exprs: list[sympy.Expr]) -> CreateGraphBranch | None:
        """Backward's branch for create_graph=True where double backward needs
        SecondDerivative (else None): it returns, and the first-order code after it runs
        otherwise. A gradient the Function leaves out is its formula, ``exprs``' entry."""
        b = self.b
        second = self.function(entries, exprs)
        if second is None:
            return None
        b.second = second
        symbols = {entry: sympy.Dummy(name) for entry, name in zip(second.entries, second.derivatives)}
        b.names.symbols.update({symbols[entry]: name for entry, name in zip(second.entries, second.derivatives)})
        b.second_symbols = symbols
        body: list[Statement] = [Comment(text) for text in _SECOND_DERIVATIVE_COMMENT]
        body.append(self.call())
        b.reference = b.names.grad_outputs[entries[0][0]]
        # A formula the Function leaves out is printed as it stands; a torch function may need
        # a number param as a tensor there.
        left_out = [expr for entry, expr in zip(entries, exprs) if entry not in symbols]
        body += b.tensorize(left_out, b.reference)
        if b.single_tangent() and not b.p.spec.fast and len(entries) == 1:
            # (One input: backward runs only when it needs its gradient.)
            ((i, _),) = entries
            term = b.backward_term(i, symbols.get(entries[0], exprs[0]))
            body.append(Return((term,)))
            return CreateGraphBranch(tuple(body))
        for j, symbol in enumerate(b.inputs):
            grad = b.names.grads[j]
            body.append(Assign(grad, NONE))
            chosen = [symbols.get((i, jj), expr) for (i, jj), expr in zip(entries, exprs) if jj == j]
            terms = [b.backward_term(i, symbols.get((i, jj), expr)) for (i, jj), expr in zip(entries, exprs) if jj == j]
            if not terms:
                continue
            if b.broadcasts:
                # Each term on its own: the outputs can differ in shape.
                shape = b.ctx_ref(b.name(symbol) + "_shape")
                terms = [method(parens(term), "sum_to_size", shape) for term in terms]
            needs = subscript("ctx.needs_input_grad", j)
            if b.upstream_may_be_none:
                outputs = [i for (i, jj) in entries if jj == j]
                body.append(If(needs, tuple(b.sum_of_present_terms(grad, outputs, terms, b.helpers(*chosen)))))
            else:
                body.append(If(needs, (Assign(grad, sum_of(terms), b.helpers(*chosen)),)))
        body.append(Return(tuple(name(g) for g in b.names.grads) + (NONE,) * len(b.params)))
        return CreateGraphBranch(tuple(body))

    def call(self) -> Assign:
        """The statement that gets the derivatives SecondDerivative returns, by their names."""
        second = self.b.second
        targets = unpack_target(second.derivatives) if len(second.derivatives) > 1 else second.derivatives[0]
        return Assign(targets, call(f"{second.class_name}.apply", *second.inputs, *second.params))
