"""The pipeline, parse -> derive -> plan -> render -> write, as a Python API.

:func:`generate_source` returns a module's text; :func:`build_spec` and
:func:`generate_file` write one, as the ``symgrad`` command does; :func:`function` loads
one in this process and returns its Function class. Every bad input raises
:class:`~symgrad.errors.SymgradError` with the one-line message the command prints, and
nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .version import __version__
from .derive import derive
from .errors import SymgradError
from .naming import check_class_name, snake_case
from .frontend.parse import parse_spec
from .plan import make_plan
from .plan.rowwise import make_rowwise_plan
from .math.reductions import is_rowwise
from .codegen.render import render, template_dir, template_fingerprint, template_name
from .spec import SAVE_POLICIES, Spec
from .codegen.load import load_source
from .codegen.write import Header, compose, write_if_changed
from .plan.docs import metadata_of

if TYPE_CHECKING:  # (torch is imported by the generated code, when it runs)
    import torch


def build_spec(
    expr: str,
    name: str,
    *,
    inputs: Iterable[str] | None = None,
    params: Iterable[str] | None = None,
    domain: Mapping[str, tuple[float, float]] | None = None,
    grads: Mapping[str, str] | None = None,
    vjps: Mapping[str, str] | None = None,
    inplace: bool = False,
    save: str = "memory",
    fuse: bool = False,
    fast: bool = False,
    templates: str | None = None,
) -> Spec:
    """Validate Python-API arguments into a :class:`Spec`, the record of one function.

    The arguments are :func:`generate_source`'s: ``domain`` maps a symbol to its sampling
    interval ``(low, high)``, ``grads`` an input to a surrogate gradient expression. The
    spec is what a generated file's header records, so ``symgrad regen`` can rebuild it.

    >>> spec = build_spec("alpha*x**2", "Scaled", params=["alpha"], domain={"x": (0, 2)})
    >>> spec.params, spec.domain
    (('alpha',), (('x', 0.0, 2.0),))
    >>> spec.to_json()
    '{"domain": [["x", 0.0, 2.0]], "expr": "alpha*x**2", "name": "Scaled", "params": ["alpha"]}'

    Raises:
        SymgradError: for a ``save`` policy other than ``"memory"`` and ``"speed"``, or a
            ``name`` that is not a string. The expression is checked when it is generated.
    """
    if save not in SAVE_POLICIES:
        raise SymgradError(f"save={save!r}: expected one of {', '.join(SAVE_POLICIES)}")
    if not isinstance(name, str):
        raise SymgradError("name must be a string")
    return Spec(
        expr=expr,
        name=name,
        inputs=None if inputs is None else tuple(inputs),
        params=tuple(params or ()),
        domain=tuple((str(k), float(lo), float(hi)) for k, (lo, hi) in sorted((domain or {}).items())),
        grads=tuple((str(k), str(v)) for k, v in sorted((grads or {}).items())),
        vjps=tuple((str(k), str(v)) for k, v in sorted((vjps or {}).items())),
        inplace=bool(inplace),
        save=save,
        fuse=bool(fuse),
        fast=bool(fast),
        templates=templates,
    )


def source_for_spec(spec: Spec, base_dir: str | Path | None = None) -> str:
    """The complete module text (header and body) that ``spec`` generates.

    A relative ``spec.templates`` is resolved against ``base_dir`` (the output folder),
    so that a recorded override still works when regenerating from elsewhere.
    """
    check_class_name(spec.name)
    if spec.inplace:
        _check_inplace(spec)
    try:
        parsed = parse_spec(spec)
        if parsed.vjps or any(is_rowwise(out.expr) for out in parsed.outputs):
            plan = make_rowwise_plan(parsed)
        else:
            plan = make_plan(derive(parsed))
    except RecursionError:
        # Not our recursion (the parser bounds nesting depth): SymPy recurses without end on
        # a few expressions. A refusal, not a crash, and nothing has been written.
        raise SymgradError(
            "SymPy recursed without end on this expression (a SymPy limitation); try an equivalent,"
            " simpler form"
        ) from None
    templates = spec.templates
    if templates is not None and base_dir is not None and not Path(templates).is_absolute():
        # Lexically, from the resolved folder (as record_templates computed it): the output
        # folder need not exist yet, and a path through a missing folder is never a directory.
        templates = os.path.normpath(Path(base_dir).resolve() / templates)
    directory = template_dir(templates)
    body = render(plan, directory)
    name = template_name(plan)
    header = Header(spec=spec, version=__version__, template=name, fingerprint=template_fingerprint(directory, name))
    return compose(header, body)


def _check_inplace(spec: Spec) -> None:
    outputs = parse_spec(spec).outputs
    if len(outputs) != 1 or outputs[0].reduction is not None:
        raise SymgradError("--inplace needs a single elementwise output (it is written into the first input)")


def generate_source(
    expr: str,
    name: str,
    *,
    inputs: Iterable[str] | None = None,
    params: Iterable[str] | None = None,
    **options: Any,
) -> str:
    """Return the source of a generated module: header, docstring, Functions and alias.

    >>> source = generate_source("x**3", "Cube")
    >>> print(source.splitlines()[0])  # doctest: +ELLIPSIS
    # Generated by symgrad ... from function.py.jinja (...). DO NOT EDIT BY HAND:
    >>> "class Cube(_CubeNoJvp):" in source and "def cube(x):" in source
    True

    Write it to a ``.py`` file and import ``cube`` from it (or use :func:`generate_file`).
    A bad expression raises, with the message the ``symgrad`` command prints:

    >>> generate_source("x +* 2", "Broken")
    Traceback (most recent call last):
    ...
    symgrad.errors.SymgradError: invalid syntax at column 4: invalid syntax

    Args:
        expr: the expression, e.g. ``"sqrt(x)+1/x"``; ``"x*y, x+y"`` gives two outputs.
        name: the class name, e.g. ``"SqrtInverse"``.
        inputs: differentiable inputs in order (default: free symbols by name, minus params).
        params: non-differentiable values passed after the inputs.
        **options: ``domain`` ({name: (low, high)}), ``grads`` ({input: expr}), ``vjps``
            ({input: expr with grad_output}),
            ``inplace``, ``save``, ``fuse``, ``fast``, ``templates``.

    Raises:
        SymgradError: for any bad input, with the message the CLI prints.
    """
    known = {"domain", "grads", "vjps", "inplace", "save", "fuse", "fast", "templates"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SymgradError(f"unknown option {unknown[0]!r}; expected one of {', '.join(sorted(known))}")
    return source_for_spec(build_spec(expr, name, inputs=inputs, params=params, **options))


def function(
    expr: str,
    name: str,
    *,
    inputs: Iterable[str] | None = None,
    params: Iterable[str] | None = None,
    **options: Any,
) -> type[torch.autograd.Function]:
    """Generate a Function and load it in this process (for notebooks): returns its class.

    The class runs from exactly the text :func:`generate_source` returns for the same
    arguments, executed as a module of its own (registered in ``sys.modules``, as
    torch.compile needs). Its functional alias, the call that also works under
    torch.compile, is the class's ``functional`` attribute; the module, with the alias under
    its own name (``cube``) and ``__symgrad__``, is ``sys.modules[Cube.__module__]``. Each
    call loads a new module, so functions of the same name never clash.

    >>> import torch
    >>> Cube = function("x**3", "Cube")
    >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
    >>> Cube.functional(x).sum().backward()
    >>> x.grad
    tensor([ 3., 12.])
    >>> torch.equal(Cube.apply(x), x**3)
    True

    Args:
        expr, name, inputs, params, **options: as for :func:`generate_source`.

    Raises:
        SymgradError: for any bad input, as :func:`generate_source` does; nothing is loaded.
    """
    source = generate_source(expr, name, inputs=inputs, params=params, **options)
    module = load_source(source, snake_case(name))
    meta = metadata_of(module)
    cls = getattr(module, meta["function"])
    cls.functional = staticmethod(getattr(module, meta["alias"]))
    return cls


def record_templates(templates: str | Path, out_dir: str | Path) -> str:
    """How a ``--templates`` folder is recorded in a spec: relative to the output folder.

    A spec in ``out_dir/*.py`` is rebuilt by ``symgrad regen out_dir`` from any working
    directory, so the override is stored relative to where the file lives, with ``/``
    separators so that the recorded text is the same on every platform.

    Raises:
        SymgradError: if ``templates`` is not a directory.
    """
    folder = Path(templates)
    if not folder.is_dir():
        raise SymgradError(f"--templates {str(templates)!r} is not a directory")
    try:
        relative = os.path.relpath(folder.resolve(), Path(out_dir).resolve())
    except ValueError:  # another drive on Windows: there is no relative path
        return folder.resolve().as_posix()
    return Path(relative).as_posix()


def output_path(spec: Spec, out_dir: str | Path) -> Path:
    """Where ``spec``'s module goes in ``out_dir``."""
    return Path(out_dir) / f"{check_class_name(spec.name)}.py"


def generate_file(spec: Spec, out_dir: str | Path = "generated", *, force: bool = False) -> tuple[Path, str]:
    """Generate ``spec`` into ``out_dir``; returns the path and "created"/"updated"/"unchanged".

    A relative ``spec.templates`` is taken relative to ``out_dir`` (see :func:`record_templates`).
    Nothing is written unless generation succeeds, and an unchanged file is not rewritten.
    ``out_dir`` is created as a package (with ``__init__.py``) where it does not exist.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> path, status = generate_file(build_spec("x**2", "Square"), out)
    >>> path.name, status
    ('square.py', 'created')
    >>> generate_file(build_spec("x**2", "Square"), out)[1]
    'unchanged'

    Raises:
        SymgradError: for bad input, or if the target is not symgrad's to overwrite: a file
            edited by hand or one written for a function of another name whose module name is
            the same (``FooBar`` and ``Foo_Bar``), unless ``force``, or a file symgrad did not
            write (always).
    """
    path = output_path(spec, out_dir)
    text = source_for_spec(spec, out_dir)  # everything that can fail is done before touching disk
    return path, write_if_changed(path, text, force=force, name=spec.name)
