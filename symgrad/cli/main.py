"""The ``symgrad`` command line: generate, regen, check, build, report."""

from __future__ import annotations

import argparse
import difflib
import importlib
import shlex
import sys
import traceback
import types
import warnings
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from ..api import generate_file, record_templates, source_for_spec
from ..codegen.write import Refused, atomic_write, ensure_package, is_hand_edited, read_spec, read_text, write_status
from ..errors import SymgradError, SymgradWarning
from ..frontend.grammar import FUNCTIONS
from ..spec import SAVE_POLICIES, Spec, parse_domain_option, parse_grad_option, parse_name_list
from ..version import __version__
from .config import load_targets

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
        epilog="Also: `symgrad regen [DIR] [--force]`, `symgrad check [DIR ...]`,"
        " `symgrad build [--config pyproject.toml] [--force] [--check]`,"
        " `symgrad report MODULE.py [--out DIR]`, `symgrad --list-functions`.",
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
    parser.add_argument("--vjp", action="append", default=[], metavar="INPUT=EXPR",
                        help="the whole gradient of INPUT, written with grad_output, e.g."
                        " x='clamp(grad_output, -1, 1)' (a surrogate backward; repeatable)")
    parser.add_argument("--inplace", action="store_true", help="overwrite the first input (ctx.mark_dirty)")
    parser.add_argument("--save", choices=SAVE_POLICIES, default="memory",
                        help="memory (default): save the fewest bytes, recompute in backward; speed: forward"
                        " also returns the derivatives and backward only multiplies")
    parser.add_argument("--fuse", action="store_true",
                        help="run forward/backward/jvp bodies through torch.compile (compiled on first use)")
    parser.add_argument("--fast", action="store_true",
                        help="eager bodies update their own temporaries in place and use addcmul"
                        " (4-15%% faster on CPU at 1e7 elements; default: plain out-of-place code)")
    parser.add_argument("--templates", metavar="DIR", help="use the templates in DIR instead of the built-in ones")
    parser.add_argument("--stdout", action="store_true", help="print the module instead of writing it")
    parser.add_argument("--force", action="store_true", help="overwrite a file that was edited by hand")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    parser.add_argument("--version", action="version", version=f"symgrad {__version__}")
    return parser


def _dir_parser(command: str, help_text: str, force: bool, many: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"symgrad {command}", description=help_text)
    if many:  # (check: a pre-commit hook passes every output folder of a project at once)
        parser.add_argument("dir", nargs="*", default=["generated"], help="folders of generated modules (default: generated/)")
    else:
        parser.add_argument("dir", nargs="?", default="generated", help="folder of generated modules (default: generated/)")
    if force:
        parser.add_argument("--force", action="store_true", help="also overwrite files edited by hand")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    return parser


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="symgrad build",
        description="Generate every function declared in the [tool.symgrad] table of a pyproject.toml.",
    )
    parser.add_argument("--config", default="pyproject.toml", help="the file to read (default: pyproject.toml)")
    parser.add_argument("--force", action="store_true", help="also overwrite files edited by hand")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    return parser


def run() -> NoReturn:
    """The ``symgrad`` command and ``python -m symgrad``: main() in a process of its own."""
    _skip_sympy_units_import()
    sys.exit(main())


class _SympyUnitsStandIn(types.ModuleType):
    """sympy.physics.units for the command's process: see _skip_sympy_units_import."""

    class Quantity:  # what sympy.simplify asks for; no expression symgrad parses holds one
        pass

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)  # (the import system's questions: __path__, ...)
        # Anything else is the real module's, imported now.
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def _skip_sympy_units_import() -> None:
    """Spare the command SymPy's import of sympy.physics.units: 0.4 s of the 1.8 s that
    `symgrad "sqrt(x)+1/x" --name SqrtInverse` took here, half of what it spent beyond
    importing sympy, jinja2 and black (medians of 15 runs, README "Command line").

    sympy.simplify (SymPy 1.14) imports that package on its first call only to ask whether
    the expression holds a physical Quantity, and symgrad's never do: parse admits no
    units. So in the command's own process, where only symgrad, SymPy, Jinja2 and black
    run, and never where symgrad is imported as a library, a stand-in answers that
    question. Any other name imported from it (SymPy's checksol imports Unit) is the real
    module's, imported then.
    """
    if "sympy.physics.units" not in sys.modules:
        sys.modules["sympy.physics.units"] = _SympyUnitsStandIn("sympy.physics.units")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        _warnings_as_lines()
        return _main(args)


def _warnings_as_lines() -> None:
    """Print each SymgradWarning as one line, ``symgrad: warning: ...``, on stderr, every
    time, as it happens (in `symgrad build`, next to the function's own line); other
    warnings are shown as Python shows them. The caller restores the warning state."""
    shown_by_python = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, SymgradWarning):
            print(f"symgrad: warning: {message}", file=sys.stderr)
        else:
            shown_by_python(message, category, filename, lineno, file, line)

    warnings.simplefilter("always", SymgradWarning)
    warnings.showwarning = show


def _main(args: list[str]) -> int:
    debug = "--debug" in args
    try:
        if args[:1] == ["--list-functions"]:
            return _list_functions()
        if args[:1] == ["regen"]:
            options = _dir_parser("regen", "Rebuild every generated module from its recorded spec.", True).parse_args(args[1:])
            return regen(Path(options.dir), force=options.force)
        if args[:1] == ["check"]:
            options = _dir_parser("check", "Exit 1 if any generated module differs from what regen would write.", False, many=True).parse_args(args[1:])
            return max([check(Path(directory)) for directory in options.dir])
        if args[:1] == ["report"]:
            # Imported here: the report runs torch, which the generator never imports.
            from ..report.command import main as report

            return report(args[1:])
        if args[:1] == ["build"]:
            options = _build_parser().parse_args(args[1:])
            return build(Path(options.config), force=options.force, check_only=options.check)
        parser = _generate_parser()
        return _generate(parser.parse_args(_expression_last(args)))
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


def _expression_last(args: list[str]) -> list[str]:
    """Let an expression start with a minus sign.

    argparse reads ``-x**2`` as an unknown option. symgrad has no short options besides
    ``-h``, so any other argument that starts with a single "-" is the expression (an
    option's value never is: none of ours starts with "-"); it is moved behind "--".
    """
    if "--" in args:
        return args
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and arg not in ("-", "-h"):
            return args[:index] + args[index + 1 :] + ["--", arg]
    return args


def _generate(options: argparse.Namespace) -> int:
    templates = options.templates
    if templates is not None:
        # Recorded relative to the output folder, so that regen finds it from anywhere; also
        # with --stdout, so that the printed module is exactly the file that would be written.
        templates = record_templates(templates, options.out)
    spec = Spec(
        expr=options.expr,
        name=options.name,
        inputs=parse_name_list(options.inputs, "--inputs"),
        params=parse_name_list(options.params, "--params") or (),
        domain=tuple(parse_domain_option(d) for d in options.domain),
        grads=tuple(parse_grad_option(g) for g in options.grad),
        vjps=tuple(parse_grad_option(v, "--vjp") for v in options.vjp),
        inplace=options.inplace,
        save=options.save,
        fuse=options.fuse,
        fast=options.fast,
        templates=templates,
    )
    if options.stdout:
        sys.stdout.write(source_for_spec(spec, options.out))
        return EXIT_OK
    path, _status = generate_file(spec, options.out, force=options.force)
    print(path)
    return EXIT_OK


def _modules(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise SymgradError(f"{directory} is not a directory")
    return sorted(p for p in directory.glob("*.py") if p.name != "__init__.py")


def _sync(path: Path, make_text: Callable[[], str], force: bool, name: str | None = None) -> tuple[str, str]:
    """Generate one file and write it if it changed: (status, reason) for its report line.

    status is "created", "updated", "unchanged", "refused" (symgrad may not overwrite it:
    with ``name``, also a file written for a function of another name) or "failed"
    (generation or the write failed; the old file is left as it was).
    """
    try:
        text = make_text()
        status = write_status(path, text, force, name)
        if status != "unchanged":
            ensure_package(path.parent)
            atomic_write(path, text)
    except Refused as exc:
        return "refused", exc.reason
    except SymgradError as exc:
        return "failed", str(exc)
    return status, ""


def _report(path: Path, status: str, reason: str) -> bool:
    """Print one file's line; True if it counts as a failure (exit 1)."""
    print(f"{status} {path}: {reason}" if reason else f"{status} {path}")
    return status in ("refused", "failed")


def regen(directory: Path, force: bool = False) -> int:
    """Rebuild every symgrad module in ``directory`` from its recorded spec.

    Writes only files whose content changes; prints one line per file; returns 1 if any
    file was refused or failed, else 0.
    """
    failures = 0
    for path in _modules(directory):
        text = read_text(path)
        try:
            spec = None if text is None else read_spec(text)
        except SymgradError as exc:
            failures += _report(path, "failed", f"cannot rebuild it: {exc}")
            continue
        if spec is None:
            # A user's own helper module may live beside generated ones; leave it alone.
            print(f"skipped {path}: not written by symgrad")
            continue
        failures += _report(path, *_sync(path, lambda: source_for_spec(spec, directory), force))
    return EXIT_FAILED if failures else EXIT_OK


def check(directory: Path) -> int:
    """Exit 0 if every module is exactly what regen would write, 1 otherwise (black's --check)."""
    fix = _command("symgrad", "regen", str(directory))
    problems: list[str] = []
    checked = 0
    for path in _modules(directory):
        text = read_text(path)
        try:
            spec = None if text is None else read_spec(text)
        except SymgradError as exc:  # a malformed record: it claims to be symgrad's
            spec, expected, error = None, "", exc
        else:
            if spec is None:
                continue  # not symgrad's file: nothing to check
            try:
                expected, error = source_for_spec(spec, directory), None
            except SymgradError as exc:
                expected, error = "", exc
        checked += 1
        if error is not None:
            print(f"cannot rebuild {path}: {error}")
            problems.append("failed")
        elif text != expected:
            problems.append(_compare(path, text, expected, fix))
    return _summary(problems, checked, fix)


def build(config: Path, force: bool = False, check_only: bool = False) -> int:
    """Generate every function declared in ``config``'s ``[tool.symgrad]`` table.

    The same per-file lines, refusal rules and exit codes as :func:`regen`; with
    ``check_only`` nothing is written and the result is reported like :func:`check`.
    """
    targets = load_targets(config)  # a mistake anywhere in the table writes nothing
    if check_only:
        fix = _command("symgrad", "build", "--config", str(config))
        problems: list[str] = []
        for target in targets:
            try:
                expected = source_for_spec(target.spec, target.out)
            except SymgradError as exc:
                print(f"cannot build {target.path}: {exc}")
                problems.append("failed")
                continue
            text = read_text(target.path)
            if text != expected:
                problems.append(_compare(target.path, text, expected, fix))
        return _summary(problems, len(targets), fix)
    failures = 0
    for target in targets:
        make = lambda target=target: source_for_spec(target.spec, target.out)  # noqa: E731
        failures += _report(target.path, *_sync(target.path, make, force, target.spec.name))
    return EXIT_FAILED if failures else EXIT_OK


def _compare(path: Path, text: str | None, expected: str, fix: str) -> str:
    """Print why ``path`` differs from ``expected``, with a short diff; returns the kind:
    "missing", "unreadable", "edited" (by hand) or "stale"."""
    if text is None:
        if path.exists():
            print(f"cannot read {path} as UTF-8 text; it is not symgrad's to overwrite")
            return "unreadable"
        print(f"would create {path}; fix: {fix}")
        return "missing"
    if is_hand_edited(text):
        print(f"{path} was edited by hand; fix: move the change into the expression or a template, then {fix} --force")
        kind = "edited"
    else:
        print(f"would update {path}; fix: {fix}")
        kind = "stale"
    diff = list(difflib.unified_diff(
        text.splitlines(), expected.splitlines(), f"{path} (on disk)", f"{path} (symgrad would write)", lineterm="", n=1
    ))
    print("\n".join(diff[:DIFF_LINES]) + ("\n..." if len(diff) > DIFF_LINES else ""))
    return kind


def _summary(problems: list[str], checked: int, fix: str) -> int:
    """The last line of check: exit 1 with the fixing command if anything differs."""
    files = f"{checked} file{'s' if checked != 1 else ''}"
    if not problems:
        print(f"{files} up to date")
        return EXIT_OK
    hint = " (add --force to discard hand edits)" if "edited" in problems else ""
    print(f"{len(problems)} of {files} would change; run `{fix}`{hint}")
    return EXIT_FAILED


def _command(*words: str) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _list_functions() -> int:
    width = max(len(name) for name in FUNCTIONS)
    for entry in FUNCTIONS.values():
        note = f"  ({entry.note})" if entry.note else ""
        print(f"{entry.name:<{width}}  {entry.torch}{note}")
    return EXIT_OK
