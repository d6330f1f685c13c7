"""The report's three forms: a compact table (stdout), a PNG of error against x, and a
self-contained HTML page that shows both."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Sequence

from .accuracy import DTYPES, GRADIENT, VALUE, Accuracy, Curve
from .cost import Cost
from .subject import Subject

# The epsilon of each dtype (torch.finfo(...).eps), for the picture's reference line.
EPSILON = {"float32": 2.0**-23, "float64": 2.0**-52}
# The table lists the points where an error is above this many epsilons (the tests hold
# symgrad to torch's own kernels within 4 ulps), or not finite.
ROUNDING_ULPS = 4
# The relative error at which the picture draws inf or nan results (as crosses): above any
# finite error worth telling apart (1 is every digit wrong). Exact results sit at the
# bottom, at a hundredth of the dtype's epsilon.
NON_FINITE_Y = 1e3
# The x axis is symmetric-log: these decades label it on both sides of 0.
X_TICKS = (-1e30, -1e20, -1e10, -1.0, -1e-10, -1e-20, 0.0, 1e-20, 1e-10, 1.0, 1e10, 1e20, 1e30)
MATPLOTLIB_HINT = "(no PNG/HTML: matplotlib is not installed; pip install 'symgrad[report]')"


def _cell(curve: Curve | None) -> str:
    if curve is None:
        return "-"
    if curve.non_finite:
        return f"inf/nan at {curve.non_finite} pts"
    worst, _ = curve.worst
    return f"{worst:.3g}" if worst >= 0.01 else "0" if worst == 0 else "<0.01"


def table(subject: Subject, accuracy: Accuracy, costs: Sequence[Cost], size: int | None) -> str:
    """The compact text report."""
    lines = [f"{subject.name}: {subject.expr}  [{subject.source}]"]
    labels = list(subject.implementations)
    width = max(len(label) for label in [*labels, "implementation", "torch.compile"]) + 2
    quantities = [(dtype, quantity) for dtype in DTYPES for quantity in (VALUE, GRADIENT)]
    headers = [f"{dtype} {'grad' if quantity == GRADIENT else quantity}" for dtype, quantity in quantities]
    column = max(20, *(len(h) + 2 for h in headers))
    index = {(c.output, c.input, c.quantity, c.dtype, c.implementation): c for c in accuracy.curves}
    points = max((len(c.x) for c in accuracy.curves), default=0)
    lines.append(
        f"accuracy: worst error in ulps (epsilons of the dtype) against mpmath, over {points} points"
        " from -1e30 to 1e30 and the singular ones"
    )
    for output in range(len(subject.outputs)):
        for name in subject.inputs:
            other = {n: v for n, v in accuracy.anchors.items() if n != name}
            other.update(subject.params)
            where = ", ".join(f"{n}={v:g}" for n, v in other.items())
            title = str(subject.outputs[output].expr)
            if subject.outputs[output].reduction:
                title = f"{subject.outputs[output].reduction}({title}), per element"
            along = f" along {name}" if len(subject.inputs) > 1 else ""
            lines.append(f"  {title}{along}" + (f" at {where}" if where else ""))
            lines.append("    " + "implementation".ljust(width) + "".join(h.ljust(column) for h in headers).rstrip())
            for label in labels:
                cells = [_cell(index.get((output, name, quantity, dtype, label))) for dtype, quantity in quantities]
                lines.append("    " + label.ljust(width) + "".join(c.ljust(column) for c in cells).rstrip())
    worst = _worst_points(subject, accuracy)
    if worst:
        lines.append("  worst points (error over %d ulps or not finite):" % ROUNDING_ULPS)
        lines.extend(f"    {line}" for line in worst)
    if costs:
        lines.append(f"cost at N={size:.0e} float32, fwd+bwd (median):")
        lines.append("    " + "implementation".ljust(width) + "ms".ljust(10) + "vs eager".ljust(10) + "saved B/element")
        for cost in costs:
            lines.append(
                "    " + cost.implementation.ljust(width) + f"{cost.median_ms:<10.3f}{cost.ratio:<10.2f}{cost.saved_per_element:g}"
            )
    return "\n".join(lines)


def _worst_points(subject: Subject, accuracy: Accuracy, limit: int = 8) -> list[str]:
    bad = [c for c in accuracy.curves if c.worst[0] > ROUNDING_ULPS]
    bad.sort(key=lambda c: (-c.non_finite, -c.worst[0]))
    lines = []
    for curve in bad[:limit]:
        worst, x = curve.worst
        what = "inf or nan" if math.isinf(worst) else f"{worst:.3g} ulps"
        along = f"d/d{curve.input}" if curve.quantity == GRADIENT else "value"
        output = f"output {curve.output + 1} " if len(subject.outputs) > 1 else ""
        lines.append(f"{curve.implementation}, {curve.dtype} {output}{along}: {what} at {curve.input}={x:.4g}")
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit} more")
    return lines


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    exponent = round(math.log10(abs(value)))
    return ("-" if value < 0 else "") + ("1" if exponent == 0 else f"1e{exponent}")


def have_matplotlib() -> bool:
    """Whether the PNG can be drawn (the ``report`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def png(subject: Subject, accuracy: Accuracy, path: Path) -> None:
    """Error against x: one panel per (output, input, quantity) and dtype, one line per
    implementation, the dtype's epsilon dashed; points that are inf or nan as crosses at
    the top, exact points at the bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (output, name, quantity)
        for output in range(len(subject.outputs))
        for name in subject.inputs
        for quantity in (VALUE, GRADIENT)
        if any(c.output == output and c.input == name and c.quantity == quantity for c in accuracy.curves)
    ]
    figure, axes = plt.subplots(len(panels), len(DTYPES), figsize=(6 * len(DTYPES), 3.2 * len(panels)), squeeze=False)
    colours = dict(zip(subject.implementations, ("tab:green", "tab:red", "tab:blue")))
    styles = dict(zip(subject.implementations, ("-", "--", ":")))
    for row, (output, name, quantity) in enumerate(panels):
        for col, dtype in enumerate(DTYPES):
            axis = axes[row][col]
            eps = EPSILON[dtype]
            floor = eps / 100
            for curve in accuracy.curves:
                if (curve.output, curve.input, curve.quantity, curve.dtype) != (output, name, quantity, dtype):
                    continue
                ys = [min(max(e * eps, floor), NON_FINITE_Y) for e in curve.errors]
                colour = colours.get(curve.implementation)
                axis.plot(curve.x, ys, styles.get(curve.implementation, "-"), color=colour, label=curve.implementation, linewidth=1.4)
                bad = [(x, NON_FINITE_Y) for x, e in zip(curve.x, curve.errors) if math.isinf(e)]
                if bad:
                    axis.scatter(*zip(*bad), marker="x", color=colour, s=18)
            axis.axhline(eps, color="k", linewidth=0.8, linestyle="-.", label=f"{dtype} epsilon")
            axis.set_xscale("symlog", linthresh=1e-30)
            axis.set_xticks(X_TICKS, [_tick(t) for t in X_TICKS], fontsize=7)
            axis.set_yscale("log")
            axis.set_ylim(floor / 2, NON_FINITE_Y * 5)
            axis.set_xlabel(name)
            axis.set_ylabel("relative error")
            what = "value" if quantity == VALUE else f"d/d{name}"
            title = str(subject.outputs[output].expr)
            axis.set_title(f"{title}: {what}, {dtype} (crosses: inf or nan)", fontsize=9)
    # One legend for all panels, below them: inside a panel it would hide the inf/nan crosses.
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += axes[0][-1].get_legend_handles_labels()[0][-1:]
    labels += axes[0][-1].get_legend_handles_labels()[1][-1:]
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    figure.suptitle(f"{subject.name}: error against mpmath", fontsize=11)
    figure.tight_layout(rect=(0, 0.4 / (3.2 * len(panels)), 1, 1))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def html_page(subject: Subject, text: str, png_path: Path | None) -> str:
    """A small self-contained page: the table, and the PNG embedded as a data URI."""
    image = ""
    if png_path is not None:
        data = base64.b64encode(png_path.read_bytes()).decode("ascii")
        image = f'<img alt="error against x" src="data:image/png;base64,{data}">\n'
    title = html.escape(f"symgrad report: {subject.name}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em;overflow:auto}"
        "img{max-width:100%}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n<pre>{html.escape(text)}</pre>\n{image}</body>\n</html>\n"
    )
