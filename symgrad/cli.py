"""The ``symgrad`` command line: generate, regen, check."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn, Sequence

from . import __version__
from .api import generate_file, source_for_spec
from .errors import SymgradError
from .functions import FUNCTIONS
from .spec import Spec, parse_domain_option, parse_grad_option, parse_name_list
from .write import check_writable, read_spec, write_if_changed

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 123
DIFF_LINES = 40


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a one-line SymgradError (exit 2), not usage text."""

    def error(self, message: str) -> NoReturn:
        raise SymgradError(message)


def _generate_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="symgrad",
        description="Generate a verified torch.autograd.Function from a SymPy expression.",
        epilog="Also: `symgrad regen [DIR] [--force]`, `symgrad check [DIR]`, `symgrad --list-functions`.",
    )
    parser.add_argument("expr", help='the expression, e.g. "sqrt(x)+1/x"; "a*b, a+b" gives two outputs')
    parser.add_argument("--name", required=True, help="class name, CamelCase, e.g. SqrtInverse")
    parser.add_argument("--inputs", help="differentiable inputs in order, e.g. x,y (default: the free symbols by name)")
    parser.add_argument("--params", help="non-differentiable params passed after the inputs, e.g. alpha,beta")
    parser.add_argument("--out", default="generated", help="output folder (default: generated/)")
    parser.add_argument("--domain", action="append", default=[], metavar="NAME=LOW:HIGH",
                        help="sampling interval for tests, e.g. x=0.1:10 (repeatable)")
    parser.add_argument("--grad", action="append", default=[], metavar="INPUT=EXPR",
                        help="surrogate gradient replacing d(output)/d(INPUT), e.g. x=1 (repeatable)")
    parser.add_argument("--inplace", action="store_true", help="overwrite the first input (ctx.mark_dirty)")
    parser.add_argument("--templates", metavar="DIR", help="use the templates in DIR instead of the built-in ones")
    parser.add_argument("--stdout", action="store_true", help="print the module instead of writing it")
    parser.add_argument("--force", action="store_true", help="overwrite a file that was edited by hand")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    parser.add_argument("--version", action="version", version=f"symgrad {__version__}")
    return parser


def _dir_parser(command: str, help_text: str, force: bool) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"symgrad {command}", description=help_text)
    parser.add_argument("dir", nargs="?", default="generated", help="folder of generated modules (default: generated/)")
    if force:
        parser.add_argument("--force", action="store_true", help="also overwrite files edited by hand")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        if args[:1] == ["--list-functions"]:
            return _list_functions()
        if args[:1] == ["regen"]:
            options = _dir_parser("regen", "Rebuild every generated module from its recorded spec.", True).parse_args(args[1:])
            return regen(Path(options.dir), force=options.force)
        if args[:1] == ["check"]:
            options = _dir_parser("check", "Exit 1 if any generated module differs from what regen would write.", False).parse_args(args[1:])
            return check(Path(options.dir))
        return _generate(_generate_parser().parse_args(args))
    except SymgradError as exc:
        print(f"symgrad: error: {exc}", file=sys.stderr)
        if exc.caret:
            print(exc.caret, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in symgrad, not bad input
        if debug:
            traceback.print_exc()
        print(f"symgrad: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _generate(options: argparse.Namespace) -> int:
    templates = options.templates
    if templates is not None and not options.stdout:
        # Recorded relative to the output folder, so that regen finds it from anywhere.
        templates = os.path.relpath(Path(templates).resolve(), Path(options.out).resolve())
    spec = Spec(
        expr=options.expr,
        name=options.name,
        inputs=parse_name_list(options.inputs, "--inputs"),
        params=parse_name_list(options.params, "--params") or (),
        domain=tuple(parse_domain_option(d) for d in options.domain),
        grads=tuple(parse_grad_option(g) for g in options.grad),
        inplace=options.inplace,
        templates=templates,
    )
    if options.stdout:
        sys.stdout.write(source_for_spec(spec))
        return EXIT_OK
    path, status = generate_file(spec, options.out, force=options.force)
    print(path)
    return EXIT_OK


def _modules(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise SymgradError(f"{directory} is not a directory")
    return sorted(p for p in directory.glob("*.py") if p.name != "__init__.py")


def regen(directory: Path, force: bool = False) -> int:
    """Rebuild every symgrad module in ``directory``; exit 1 if any was refused."""
    refused = 0
    for path in _modules(directory):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            spec = read_spec(text)
        except SymgradError as exc:
            print(f"refused {path}: {exc}")
            refused += 1
            continue
        if spec is None:
            print(f"skipped {path}: not written by symgrad")
            continue
        try:
            new_text = source_for_spec(spec, directory)
            if new_text != text:
                problem = check_writable(path, force)
                if problem:
                    raise SymgradError(problem)
            status = write_if_changed(path, new_text, force=force)
        except SymgradError as exc:
            print(f"refused {path}: {exc}")
            refused += 1
            continue
        print(f"{status} {path}")
    return EXIT_FAILED if refused else EXIT_OK


def check(directory: Path) -> int:
    """Exit 0 if every module is exactly what regen would write, 1 otherwise (black's --check)."""
    stale = 0
    for path in _modules(directory):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            spec = read_spec(text)
            if spec is None:
                continue
            expected = source_for_spec(spec, directory)
        except SymgradError as exc:
            print(f"{path}: cannot rebuild: {exc}")
            stale += 1
            continue
        if expected != text:
            stale += 1
            print(f"would update {path}")
            diff = list(difflib.unified_diff(
                text.splitlines(), expected.splitlines(), f"{path} (on disk)", f"{path} (symgrad would write)", lineterm="", n=1
            ))
            print("\n".join(diff[:DIFF_LINES]) + ("\n..." if len(diff) > DIFF_LINES else ""))
    if stale:
        print(f"{stale} file{'s' if stale != 1 else ''} would change; run `symgrad regen {directory}` to update"
              " (add --force to overwrite hand edits)")
        return EXIT_FAILED
    return EXIT_OK


def _list_functions() -> int:
    width = max(len(name) for name in FUNCTIONS)
    for entry in FUNCTIONS.values():
        note = f"  ({entry.note})" if entry.note else ""
        print(f"{entry.name:<{width}}  {entry.torch}{note}")
    return EXIT_OK
