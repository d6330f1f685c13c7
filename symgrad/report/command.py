"""``symgrad report MODULE.py`` and ``symgrad report EXPR --name NAME``: is it right, and
is it fast?

Prints the table; with ``--out DIR`` also writes ``DIR/<module>.png`` and
``DIR/<module>.html``. Bad input raises SymgradError before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from ..errors import SymgradError
from ..naming import snake_case
from ..spec import SAVE_POLICIES, Spec, parse_domain_option, parse_name_list
from . import accuracy, cost, output
from .subject import Subject, load_expression, load_module_file


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SymgradError(message)


def parser() -> argparse.ArgumentParser:
    """The ``symgrad report`` command line."""
    p = _Parser(
        prog="symgrad report",
        description="Accuracy (against mpmath, float32 and float64) and cost (saved bytes, fwd+bwd time) of a"
        " generated Function, against eager autograd of the same formula, torch's own function and torch.compile.",
    )
    p.add_argument("target", help="a generated module (path/to/module.py), or an expression with --name")
    p.add_argument("--name", help="class name, when TARGET is an expression")
    p.add_argument("--inputs", help="with an expression: differentiable inputs in order, e.g. x,y")
    p.add_argument("--params", help="with an expression: non-differentiable params")
    p.add_argument("--domain", action="append", default=[], metavar="NAME=LOW:HIGH",
                   help="with an expression: sampling interval (timing inputs; other inputs' values in a sweep)")
    p.add_argument("--save", choices=SAVE_POLICIES, default="memory", help="with an expression: symgrad's --save")
    p.add_argument("--fuse", action="store_true", help="with an expression: symgrad's --fuse")
    p.add_argument("--out", metavar="DIR", help="also write DIR/<module>.png and DIR/<module>.html (needs matplotlib)")
    p.add_argument("--size", type=float, default=1e6, help="elements per input for the timing (default 1e6)")
    p.add_argument("--repeats", type=int, default=10, help="timed fwd+bwd runs per implementation (default 10)")
    p.add_argument("--points-per-decade", type=int, default=2, help="accuracy points per decade of |x| (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for the timing (default 1: on a shared machine a descheduled thread"
                   " stalls every parallel op)")
    p.add_argument("--no-timing", action="store_true", help="accuracy only: skip the cost measurement")
    p.add_argument("--no-compile", action="store_true", help="do not time torch.compile (its first call compiles, ~10 s)")
    p.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    return p


def main(argv: Sequence[str]) -> int:
    """Run ``symgrad report``; returns the exit code (errors are raised as SymgradError)."""
    options = parser().parse_args(_expression_last(list(argv)))
    if min(options.size, options.repeats, options.points_per_decade, options.threads) < 1:
        raise SymgradError("--size, --repeats, --points-per-decade and --threads must be at least 1")
    out = Path(options.out) if options.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise SymgradError(f"--out {out}: it exists and is not a folder")
    subject = _load(options)
    progress = _progress_bar()
    extra = {} if progress is None else {"progress": progress}
    measured = accuracy.measure(subject, subject.domain, options.points_per_decade, **extra)
    costs = []
    if not options.no_timing:
        costs = cost.measure(subject, int(options.size), options.repeats, not options.no_compile, threads=options.threads)
    text = output.table(subject, measured, costs, int(options.size))
    print(text)
    if out is None:
        return 0
    if not output.have_matplotlib():
        print(output.MATPLOTLIB_HINT)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    stem = snake_case(subject.name)
    png_path, html_path = out / f"{stem}.png", out / f"{stem}.html"
    output.png(subject, measured, png_path)
    html_path.write_text(output.html_page(subject, text, png_path), encoding="utf-8")
    print(f"wrote {png_path} and {html_path}")
    return 0


def _load(options: argparse.Namespace) -> Subject:
    target = options.target
    if options.name is None:
        # (An expression may hold "/", as in x/y: only --name makes TARGET an expression.)
        if target.endswith(".py") or Path(target).exists():
            return load_module_file(Path(target))
        raise SymgradError(f"{target!r} is not a .py file: to report on an expression, give its class name with --name")
    spec = Spec(
        expr=target,
        name=options.name,
        inputs=parse_name_list(options.inputs, "--inputs"),
        params=parse_name_list(options.params, "--params") or (),
        domain=tuple(parse_domain_option(d) for d in options.domain),
        save=options.save,
        fuse=options.fuse,
    )
    return load_expression(spec)


def _progress_bar() -> Callable[[int], Any] | None:
    """A tqdm bar over the accuracy points (of every input and dtype) on stderr while it is
    a terminal; otherwise, or without tqdm, None (no bar)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda total: tqdm(total=total, desc="accuracy", unit="pt", file=sys.stderr, leave=False)


def _expression_last(args: list[str]) -> list[str]:
    """An expression may start with a minus sign (``-x**2``): moved behind "--", as the
    generate command does."""
    if "--" in args:
        return args
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and arg not in ("-h",):
            return args[:index] + args[index + 1 :] + ["--", arg]
    return args
