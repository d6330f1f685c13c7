"""Stage 3: from a derivation to the :class:`~.ir.Plan` the templates print.

Names, CSE temporaries, saved tensors, method bodies, the float16 policy and the helpers
each module carries are all decided here, as data; the templates only loop and print.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from ..derive import Derivation, with_derivatives_as_outputs
from ..errors import SymgradError
from ..math.half import loses_in_float16
from ..naming import check_class_name
from ..codegen.printer import HELPERS
from ..codegen.syntax import call, source, tuple_of
from .bodies import Builder
from .docs import Docs
from .dtype import Decider, HalfPolicy, half_in_float32
from .fused import FusedBodies, eager_reason
from .ir import Line, Method, Plan
from .names import Names, assign_names, value_name
from .operations import eager_operations
from .saved import choose_saved_forms

# Helpers that call other helpers (the float16 pair).
_HELPER_CALLS = {"_float32_for_half": ("_half_of",)}


def make_plan(derivation: Derivation) -> Plan:
    """Decide names, CSE temporaries and saved tensors for a derivation."""
    parsed = derivation.parsed
    alias = check_class_name(parsed.spec.name)
    if parsed.spec.save == "speed":
        if parsed.spec.inplace:
            raise SymgradError("--save speed and --inplace cannot be combined: an in-place Function has one output")
        derivation = with_derivatives_as_outputs(derivation)
    names = assign_names(derivation, alias)
    assembler = _Assembler(derivation, names, _rows(derivation, names), alias)
    plan = assembler.build()
    if assembler.b.second_derivative_needs_inputs:
        # Double backward needs the inputs that a gradient written with the output does not
        # save: where the inputs cost no more tensors, backward takes them instead, and
        # first-order backward recomputes what it had read from the output.
        names = assign_names(derivation, alias)
        rows = _rows(derivation, names, avoid_results=True)
        if rows is not None:
            plan = _Assembler(derivation, names, rows, alias).build()
    return plan


def _rows(
    derivation: Derivation, names: Names, avoid_results: bool = False
) -> tuple[tuple[sympy.Expr, ...], ...] | None:
    """The gradient rows backward prints (choose_saved_forms), with the derivatives forward
    returned in place of theirs; None where ``avoid_results`` and every choice that saves no
    output saves more tensors."""
    rows = choose_saved_forms(derivation, names, avoid_results)
    if rows is None:
        return None
    n_user = len(derivation.parsed.outputs) - len(derivation.derivatives)
    for k, entries in enumerate(derivation.derivatives):
        for i, j in entries:
            # Backward multiplies by the derivative forward returned, instead of recomputing it.
            rows[i] = rows[i][:j] + (names.results[n_user + k],) + rows[i][j + 1 :]
    return tuple(rows)


@dataclass(frozen=True)
class Float16Verdict:
    """What the float16 probes decided (_Assembler.float16_verdict): the methods ("forward",
    "backward", "jvp") that keep the float16 contract op by op, and those of them that keep
    it only multiplying the upstream gradient or tangent first."""

    kept: frozenset[str] = frozenset()
    upstream_first: frozenset[str] = frozenset()


def _upstream_products(terms: list[tuple[sympy.Symbol, sympy.Expr]], upstream_first: bool) -> sympy.Expr:
    """The sum of ``scale * row`` over ``terms``, in the order the body multiplies: the row
    first and the scale last (an unevaluated product, which math.half.emulate computes in
    its arguments' order), or SymPy's product, whose scale symbol sorts first and so takes
    the coefficient first, as ``grad_output * 3 * x**2`` does."""
    if upstream_first:
        return sympy.Add(*(scale * row for scale, row in terms))
    return sympy.Add(*(sympy.Mul(scale, row, evaluate=False) for scale, row in terms))


class _Assembler:
    """Puts one plan together from the Builder and its collaborators."""

    def __init__(self, derivation: Derivation, names: Names, rows, alias: str) -> None:
        self.b = Builder(derivation, names, rows, alias)
        # Decided before the bodies: it sets the order they multiply the upstream in.
        self.float16 = self.float16_verdict()
        self.b.upstream_first = self.float16.upstream_first

    def build(self) -> Plan:
        b = self.b
        spec = b.p.spec
        inplace = spec.inplace
        saved = b.saving.saved()
        once = inplace and any(s in b.inputs for s in saved)
        fused = None
        if spec.fuse:
            if inplace:
                raise SymgradError("--fuse and --inplace cannot be combined: an in-place Function is not fused")
            fused = FusedBodies(b).build(saved)
        value = value_call = None
        if b.speed and not any(b.d.surrogate):
            value = b.forward(outputs=b.n_user)
            if not fused:  # (fused, it runs compiled)
                value = b.eager(value)
            args = b.forward_params()
            value_call = source(call(value_name(b.alias), *args))
            if fused and eager_reason(value, frozenset()) is None:
                runner_call = call(fused.plan.runner, value_name(b.alias), *args, operations=eager_operations(value))
                value_call = source(runner_call)
        out_of_place_forward = None if fused else b.forward()
        forward = fused.forward_call if fused else b.eager(out_of_place_forward)
        backward = fused.backward_call if fused else b.eager(b.backward(saved), differentiating=True)
        readers = b.saving.inplace_readers() if inplace else {}
        if readers:
            reading = {k: tuple_of(*v) for k, v in readers.items()}
            refusal = Line(call("_refuse_overwritten", "ctx", **reading), frozenset({"_refuse_overwritten"}))
            backward = dataclasses.replace(backward, body=(refusal, *backward.body))
        jvp = fused.jvp_call if fused else b.eager(b.jvp(saved), differentiating=True)
        docs = Docs(b)
        plan = Plan(
            value_name=value_name(b.alias) if value else None,
            value=value,
            value_call=value_call,
            class_name=spec.name,
            no_jvp_class=f"_{spec.name}NoJvp",
            alias=b.alias,
            public_params=tuple(b.names.public[s] for s in b.inputs + b.params),
            call_args=tuple(b.names.public[s] for s in b.inputs + b.params),
            public_outputs="" if not b.speed else "[0]" if b.n_user == 1 else f"[:{b.n_user}]",
            docstring=docs.docstring(saved),
            saved_comment=docs.saved_comment(saved, once),
            forward=forward,
            setup_context=b.saving.setup_context(saved),
            backward=backward,
            jvp=jvp,
            setup_forward_ad=b.saving.setup_forward_ad(saved),
            metadata=docs.metadata(),
            inplace=inplace,
            refuses_double_backward=once,
            surrogate=any(b.d.surrogate),
            fused=fused.plan if fused else None,
            compiled_forward=_compiled_forward(out_of_place_forward, forward),
            second_derivative=b.second,
        )
        if not inplace:
            plan = half_in_float32(plan, self.half_policy())
        return _with_helpers(plan)

    def half_policy(self) -> HalfPolicy:
        """The float16 pass's view of this module (dtype.HalfPolicy)."""
        b = self.b
        half = b.names.namer.claim("half")
        # --save speed: forward's derivatives stay float32, and so their tangents and
        # cotangents (not converted, not rounded): a float16 derivative overflows where the
        # gradient it multiplies into does not (log(1 + x**2)*y + x*y**3's derivative by x is
        # 9.1e4 at y = 45).
        rounded = b.n_user if b.speed else None
        user = b.names.results[: b.n_user]
        tensors = {b.name(s) for s in b.inputs + b.params + user}
        tensors |= set(b.names.grad_outputs[: b.n_user] + b.names.tangents)
        if b.second:
            tensors |= set(b.second.backward.params[1:])  # (its cotangents)
        by_values, by_tangents = self.output_deciders()
        per_output = not b.p.spec.fast
        in_float16 = self.float16.kept if per_output else frozenset()
        return HalfPolicy(half, frozenset(tensors), rounded, by_values, by_tangents, per_output, in_float16)

    def float16_verdict(self) -> Float16Verdict:
        """The methods whose output expressions, computed op by op in float16, keep the
        float16 contract at every probe point (symgrad.math.half): forward's outputs,
        backward's gradients (upstream gradient times row, summed over outputs) and jvp's
        tangents. None under --save speed (its derivatives stay float32), --fuse (compiled
        bodies), --fast or --inplace (bodies decided whole) or a reduction (a float16 sum of
        many terms).

        Backward and jvp multiply the upstream last (code.times_upstream); where that order
        loses the contract and the upstream-first order keeps it, the method takes that
        order instead, and stays in float16.
        """
        b = self.b
        spec = b.p.spec
        if b.speed or spec.fuse or spec.fast or spec.inplace or any(out.reduction for out in b.outputs):
            return Float16Verdict()
        symbols = list(b.inputs + b.params)
        stored = {b.names.results[i]: b.d.forward[i] for i in range(b.n_user)}
        entries = b.gradient_entries()
        kept = set()
        upstream_first = set()
        if not any(loses_in_float16(b.d.forward[i], symbols) for i in range(b.n_user)):
            kept.add("forward")
        scales = [sympy.Symbol(f"_scale{i}", real=True) for i in range(max(b.n_out, len(b.inputs)))]
        by_method = {
            "backward": ([[(scales[i], b.rows[i][j]) for i, k in entries if k == j] for j in range(len(b.inputs))], b.n_out),
            "jvp": ([[(scales[j], b.rows[i][j]) for k, j in entries if k == i] for i in range(b.n_out)], len(b.inputs)),
        }
        for kind, (sums, n_scales) in by_method.items():
            variables = symbols + scales[:n_scales]
            for first in (False, True):
                exprs = [_upstream_products(terms, first) for terms in sums if terms]
                if not any(loses_in_float16(e, variables, frozenset(scales), stored) for e in exprs):
                    kept.add(kind)
                    if first:
                        upstream_first.add(kind)
                    break
        return Float16Verdict(frozenset(kept), frozenset(upstream_first))

    def output_deciders(self) -> tuple[tuple[Decider | None, ...] | None, tuple[Decider | None, ...] | None]:
        """For a module of several outputs, per user output: the name rounding it back to
        float16 (Decider), decided by the tensors it depends on (in forward, the inputs and
        params; in jvp, their tangents), or None where those are all of them and the body's
        own decision serves. (None, None) where every output is such.

        One decision for all outputs would round ``exp(y), x*y``'s ``exp(y)`` to float16 for
        a float16 x and a 0-d float32 y, where torch gives float32.
        """
        b = self.b
        if b.n_user < 2:
            return None, None
        symbols = b.inputs + b.params
        by_values: list[Decider | None] = []
        by_tangents: list[Decider | None] = []
        for k in range(b.n_user):
            used = [s for s in symbols if s in b.d.forward[k].free_symbols]
            if len(used) == len(symbols):
                by_values.append(None)
                by_tangents.append(None)
                continue
            name = b.names.namer.claim(f"{b.name(b.names.results[k])}_half")
            by_values.append(Decider(name, tuple(b.name(s) for s in used)))
            # (Each param's tangent too: the parameter jvp always has, None for a number,
            # where the param itself may not be saved.)
            by_tangents.append(Decider(name, tuple(b.names.tangents[symbols.index(s)] for s in used)))
        if not any(by_values):
            return None, None
        return tuple(by_values), tuple(by_tangents)


def _compiled_forward(out_of_place: Method | None, eager: Method) -> Method | None:
    """What the torch.compile twin's forward runs: the forward as written, without buffer
    reuse, where that rewrote it (else None: one forward serves both).

    Under torch.compile the reuse buys nothing (inductor plans its own buffers), and it
    cost correctness: Dynamo in torch 2.11 returned zero gradients through some in-place
    forwards (pytorch/pytorch#180642, fixed by #180921; torch 2.13 is right). In-place
    backward and jvp bodies traced correctly on 2.11, so they stay shared.
    """
    if out_of_place is None or out_of_place == eager:
        return None
    return out_of_place


def _with_helpers(plan: Plan) -> Plan:
    """``plan`` with the source of each printer.HELPERS function its methods call (and the
    helpers those call), in name order."""
    called: set[str] = set()
    for method in plan.methods():
        called |= method.helpers
    for name in sorted(called):
        called |= set(_HELPER_CALLS.get(name, ()))
    helpers: list[str] = []
    for name, source in sorted(HELPERS.items()):
        if name in called:
            helpers += [*source, "", ""]
    fused = plan.fused and dataclasses.replace(plan.fused, helpers=tuple(helpers))
    return dataclasses.replace(plan, helpers=tuple(helpers), fused=fused)
