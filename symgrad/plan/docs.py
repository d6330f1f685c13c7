"""The module's documentation, built with the plan: its docstring (f, its derivatives and
identities), the comment on what is saved and why, and the ``__symgrad__`` metadata."""

from __future__ import annotations

import textwrap

import sympy

from ..rewrite.cost import IDENTITIES

# ``__symgrad__``'s keys that a module leaves out at these values (Docs.metadata).
_DEFAULTS = {
    "params": {},
    "outputs": ["elementwise"],
    "nondifferentiable": [],
    "surrogate": {},
    "inplace": False,
    "save": "memory",
}


def metadata_of(module) -> dict:
    """A generated module's ``__symgrad__`` with every key: the class (``function``), the
    functional alias and the keys it leaves out at their defaults. ``module``: the module,
    or its namespace."""
    namespace = module if isinstance(module, dict) else vars(module)
    data = {"function": namespace["__all__"][0], "alias": namespace["__all__"][1]}
    data.update({key: value for key, value in _DEFAULTS.items() if key != "outputs"})
    data["outputs"] = ["elementwise"]
    data.update(namespace["__symgrad__"])
    return data


class Docs:
    """Documentation of one plan (``builder``: :class:`~.bodies.Builder`)."""

    def __init__(self, builder) -> None:
        self.b = builder

    def docstring(self, saved: list[sympy.Symbol]) -> str:
        math_names = {s: s.name for s in self.b.inputs + self.b.params}
        math_names.update({r: self.b.name(r) for r in self.b.names.results})
        out_names = ["f"] if self.b.n_user == 1 else [f"f{i}" for i in range(self.b.n_user)]
        args = ", ".join(s.name for s in self.b.inputs + self.b.params)
        lines = []
        for name, out in zip(out_names, self.b.outputs):
            body = sympy.sstr(out.expr)
            if out.reduction:
                body = f"{out.reduction}({body})"
            lines.append(f"{name}({args}) = {body}")
        for i, name in enumerate(out_names):
            if not self.b.live[i]:
                lines.append(f"{name} is piecewise constant: its gradient is zero almost everywhere.")
                continue
            for j, symbol in enumerate(self.b.inputs):
                gradient = sympy.sstr((self.b.d.documented_gradients or self.b.d.gradients)[i][j])
                marker = "  (surrogate: not the true derivative)" if self.b.d.surrogate[j] else ""
                inner = "the elementwise part of " if self.b.outputs[i].reduction else ""
                lines.append(
                    f"d{name}/d{symbol.name} = {gradient}{marker}"
                    if not inner
                    else f"d({inner}{name})/d{symbol.name} = {gradient}"
                )
        identities = sorted(set(self.b.d.identities) | self.b.second_identities)
        if identities:
            lines.append("")
            uses_abs = {"sech", "sigmoid_pair"} & set(identities)
            lines += textwrap.wrap(
                (
                    "The fused bodies use these identities, which need fewer or cheaper calls in"
                    " one compiled kernel."
                    if self.b.d.parsed.spec.fuse
                    else "The bodies use these identities, which run fewer or cheaper kernels."
                )
                + " Each is accurate in float32 (the softplus ones are kept"
                " only where rounding shows it"
                + (
                    "; they give 0 where sigmoid(u) underflows, u < -88.7 in float32, where"
                    " tanh(softplus(u)) is below the smallest normal float32)"
                    if {"tanh_softplus", "cosh_softplus"} & set(identities)
                    else ")"
                )
                + (
                    ", and -|u| is written as torch.where(u > 0, -u, u), which autograd"
                    " differentiates exactly on each side:"
                    if uses_abs
                    else ":"
                ),
                width=88,
            )
            lines += [f"    {IDENTITIES[name]}" for name in identities]
        if self.b.reused:
            lines.append("")
            lines += textwrap.wrap(
                "In-place methods (.add_(), .mul_(), .exp_(), ...) only update a temporary that"
                " the same expression has just made, never an input, a saved tensor or a named"
                " value: an in-place op skips the read of a new buffer that an out-of-place op"
                " pays, and autograd, vmap and broadcasting allow each of them (symgrad.plan.inplace).",
                width=88,
            )
        if self.b.fused_terms:
            lines.append("")
            lines += [
                "A sum's product and quotient terms are added by one kernel each:",
                "    a.addcmul(l, r, value=c) = a + c*l*r",
                "    a.addcdiv(l, r, value=c) = a + c*l/r",
                "    a.add(r, alpha=c) = a + c*r",
            ]
        if self.b.speed:
            derivatives = [self.b.name(r) for r in self.b.names.results[self.b.n_user :]]
            lines.append("")
            lines += textwrap.wrap(
                f"--save speed: forward also computes {', '.join(derivatives)}, sharing work with the"
                f" output, so `{self.b.p.spec.name}.apply` returns {self.b.n_out} tensors and the alias"
                f" returns the first {self.b.n_user}. Backward multiplies by the saved derivatives"
                " instead of recomputing them; double backward differentiates them again. With"
                " grad mode off (inference), the alias computes the outputs alone.",
                width=88,
            )
        return "\n".join(lines)

    def saved_comment(self, saved: list[sympy.Symbol], once: bool) -> tuple[str, ...]:
        if not saved and not self.b.saving.saved_params():
            return ("Nothing is saved for backward: every gradient is constant.",)
        parts = []
        derivatives = set(self.b.names.results[self.b.n_user :])
        for symbol in saved:
            if symbol in derivatives:
                parts.append(f"{self.b.name(symbol)} (a derivative forward returned)")
            elif symbol in self.b.names.results:
                parts.append(f"{self.b.name(symbol)} (the output, in which the gradient is written)")
            elif once and symbol == self.b.inputs[0]:
                parts.append(f"{self.b.name(symbol)} (a copy of the input from before it is overwritten)")
            else:
                parts.append(f"{self.b.name(symbol)} (the gradient depends on it)")
        parts += [f"{self.b.name(p)} (a param the gradient uses)" for p in self.b.saving.saved_params()]
        text = "Saved for backward: " + "; ".join(parts) + "."
        if once:
            text += " The copy is not part of the graph, so double backward is refused."
        return tuple(textwrap.wrap(text, width=86))

    def metadata(self) -> str:
        """The module's ``__symgrad__``: what tests and tools read, compact (keys at their
        defaults are left out, and the class and alias are ``__all__``; :func:`metadata_of`
        reads it whole)."""
        data = self.full_metadata()
        for key in ("function", "alias"):
            del data[key]
        n_outputs = len(data["outputs"])
        defaults = {**_DEFAULTS, "outputs": ["elementwise"] * n_outputs if n_outputs == 1 else None}
        return repr({key: value for key, value in data.items() if value != defaults.get(key)})

    def full_metadata(self) -> dict:
        domain = {s.name: (lo, hi) for s, lo, hi in self.b.d.domain}
        params = {p.name: value for p, value in self.b.second_derivatives.param_samples().items()}
        data = {
            "expr": self.b.p.spec.expr,
            "function": self.b.p.spec.name,
            "alias": self.b.alias,
            "inputs": [s.name for s in self.b.inputs],
            "params": params,
            "domain": domain,
            "outputs": [out.reduction or "elementwise" for out in self.b.outputs[: self.b.n_user]],
            "nondifferentiable": [i for i, live in enumerate(self.b.live[: self.b.n_user]) if not live],
            "surrogate": {
                s.name: text
                for s, text in zip([s for s, _ in self.b.p.surrogates], [t for _, t in self.b.p.spec.grads])
            },
            "inplace": self.b.p.spec.inplace,
            "save": self.b.p.spec.save,
            "saved": [self.b.name(s) for s in self.b.saving.saved()],
        }
        return data
