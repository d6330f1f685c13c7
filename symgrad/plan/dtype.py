"""The float16 policy: bodies of more than one operation compute float16 tensors in float32,
unless every output expression keeps the float16 contract op by op (symgrad.math.half).

Eager operations on float16 round at every step, and a simplified formula's intermediates
overflow float16 long before its value does (216*x/(x**2 + 6)**3 is 0 from x = 10, and
nan from 303). So a body converts its float16 tensors with the module helper
``_float32_for_half`` and rounds what it returns back once (``_round_to``), as ATen's own
float16 kernels do. Backward returns gradients in float32: autograd rounds each to its
input's dtype itself. Not bfloat16, which has float32's range and fast CPU arithmetic
(converting it cost up to 2.4x on short bodies). Not in place (forward writes its input)
and not one operation (ATen's kernel then).

Decided on :class:`~.ir.Method`'s fields: the widening goes after the unpacking, the
rounding onto the returned values, and in backward into the branches that compute
formulas (:class:`~.ir.FirstOrderBranch`, :class:`~.ir.CreateGraphBranch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .ir import Comment, CreateGraphBranch, FirstOrderBranch, If, Method, Plan, Rounding, Statement, Widen, walk
from .operations import count_statements, every_value_is_one_operation, kernels


_BRANCHES = (FirstOrderBranch, CreateGraphBranch)


@dataclass(frozen=True)
class Decider:
    """Where an output is rounded back to float16 by the tensors it depends on: the line
    ``name = _half_of(*tensors)``."""

    name: str
    tensors: tuple[str, ...]


@dataclass(frozen=True)
class HalfPolicy:
    """What the float16 pass needs to know of a module.

    ``tensors``: the names that may hold float16 tensors (inputs, params, user outputs,
    upstream gradients, tangents); ``rounded``: how many returned values are rounded back
    (None: all; --save speed's derivatives stay float32); ``by_values`` and ``by_tangents``:
    per user output, its own Decider in forward and in jvp (:func:`output_deciders`).
    """

    half: str
    tensors: frozenset[str]
    rounded: int | None
    by_values: tuple[Decider | None, ...] | None
    by_tangents: tuple[Decider | None, ...] | None
    # Decide per returned value (the default): a body whose every value is one operation
    # is not widened. Otherwise per body (--fast keeps the output it had).
    per_output: bool = True
    # The methods ("forward", "backward", "jvp") whose every output expression keeps the
    # float16 contract computed op by op in float16 (symgrad.math.half): not widened.
    in_float16: frozenset[str] = frozenset()


def half_in_float32(plan: Plan, policy: HalfPolicy) -> Plan:
    """``plan`` with every body of more than one operation computing float16 in float32."""

    def in_float32(method: Method | None, gradients: bool = False, deciders=None, kind: str = "") -> Method | None:
        if method is None or kernels(method) <= 1:
            return method  # (a fused module's methods call its bodies: one operation)
        if kind in policy.in_float16 and not any(isinstance(s, _BRANCHES) for s in walk(method.body)):
            # (Op by op in float16 keeps the contract, measured on the formulas: not where an
            # ATen backward kernel of several calls or a create_graph branch prints otherwise.)
            return method
        if not gradients and policy.per_output and every_value_is_one_operation(method):
            return method  # (each output is one ATen kernel, which computes float16 in float32)
        if gradients:
            return _in_float32_backward(method, policy)
        return _in_float32(method, policy, deciders)

    changes: dict[str, object] = {
        "forward": in_float32(plan.forward, deciders=policy.by_values, kind="forward"),
        "compiled_forward": in_float32(plan.compiled_forward, deciders=policy.by_values, kind="forward"),
        "value": in_float32(plan.value, deciders=policy.by_values, kind="forward"),
        "backward": in_float32(plan.backward, gradients=True, kind="backward"),
        "jvp": in_float32(plan.jvp, deciders=policy.by_tangents, kind="jvp"),
    }
    if plan.fused:
        fused = plan.fused
        changes["fused"] = dataclasses.replace(
            fused,
            forward=in_float32(fused.forward, deciders=policy.by_values),
            backward=in_float32(fused.backward, gradients=True),
            jvp=in_float32(fused.jvp, deciders=policy.by_tangents),
        )
    if plan.second_derivative:
        second = plan.second_derivative
        changes["second_derivative"] = dataclasses.replace(
            second,
            forward=in_float32(second.forward),
            backward=in_float32(second.backward, gradients=True),
            jvp=in_float32(second.jvp),
        )
    return dataclasses.replace(plan, **changes)


def _widened_names(method: Method, tensors: frozenset[str]) -> tuple[str, ...]:
    """``method``'s tensors to convert: its parameters and what it unpacks from ctx."""
    unpacked = method.unpack.names if method.unpack else ()
    return tuple(n for n in (*method.params, *unpacked) if n in tensors)


def _in_float32(method: Method, policy: HalfPolicy, deciders: Sequence[Decider | None] | None) -> Method:
    """A forward or jvp computing in float32 what is float16: its tensors converted once
    they are unpacked, and the values it returns rounded back, each by its own decider
    where one is given whose tensors the body has (decided before they are converted), else
    by ``policy.half``."""
    names = _widened_names(method, policy.tensors)
    if not names:
        return method
    in_scope = set(method.params) | set(method.unpack.names if method.unpack else ())
    half = policy.half
    halves = tuple(d.name if d is not None and set(d.tensors) <= in_scope else half for d in (deciders or ()))
    own = [d for d, h in zip(deciders or (), halves) if d and h == d.name]
    # (float16 tensors are converted where any output is float16, not only where the
    # result of all of them is: y**2/(1 + y**2) beside x*y was computed in float16 for a
    # float32 x, inf/inf = nan at y = 300)
    widen = Widen(names, half, tuple((d.name, d.tensors) for d in own))
    return dataclasses.replace(method, widen=widen, rounding=Rounding(half, policy.rounded, halves))


def _in_float32_backward(method: Method, policy: HalfPolicy) -> Method:
    """A backward computing in float32 what is float16 (no rounding back: autograd rounds
    each gradient to its input's dtype), except where one ATen backward kernel call
    computes the first-order gradient, in float32 itself: only the formulas convert there.
    A fused module's compiled body (whose call is one operation here) converts for itself."""
    names = _widened_names(method, policy.tensors)
    if not names:
        return method
    # (Gradients are not rounded back: the dtype decision is not used.)
    widen = Widen(names, "_")
    body = list(method.body)
    branches = [k for k, s in enumerate(body) if isinstance(s, CreateGraphBranch)]
    if branches:
        # The create_graph branch returns; first order follows it, and converts for itself
        # where it is more than one kernel call.
        k = branches[0]
        if kernels(Method((), tuple(body[k + 1 :]), method.values)) > 1:
            body.insert(k + 1, widen)
        body[k] = CreateGraphBranch(_after_comments(body[k].body, widen))
        return dataclasses.replace(method, body=tuple(body))
    first_order = [s for s in walk(body) if isinstance(s, FirstOrderBranch)]
    # (A kernel of more than one operation converts too: tanh's is two softplus_backward
    # calls and a product.)
    if not first_order or any(count_statements(s.kernel).kernels > 1 for s in first_order):
        return dataclasses.replace(method, widen=widen)
    return dataclasses.replace(method, body=tuple(_in_formulas(body, widen)))


def _in_formulas(statements: Sequence[Statement], widen: Widen) -> list[Statement]:
    """``statements`` with ``widen`` at the start of every first-order branch's formula."""
    result: list[Statement] = []
    for statement in statements:
        if isinstance(statement, FirstOrderBranch):
            statement = FirstOrderBranch(statement.kernel, _after_comments(statement.formula, widen))
        elif isinstance(statement, If):
            statement = dataclasses.replace(
                statement,
                body=tuple(_in_formulas(statement.body, widen)),
                orelse=tuple(_in_formulas(statement.orelse, widen)),
            )
        result.append(statement)
    return result


def _after_comments(statements: Sequence[Statement], statement: Statement) -> tuple[Statement, ...]:
    """``statements`` with ``statement`` inserted after their leading comments."""
    at = 0
    while at < len(statements) and isinstance(statements[at], Comment):
        at += 1
    return (*statements[:at], statement, *statements[at:])
