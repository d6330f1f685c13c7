"""Stage 4: Jinja2 fills a template from the plan; black formats the result."""

from __future__ import annotations

import ast
import hashlib
from importlib import resources
from pathlib import Path

import black
import jinja2
import jinja2.meta

from ..errors import SymgradError
from ..plan import Plan
from .printer import HELPERS

FUNCTION_TEMPLATE = "function.py.jinja"
INPLACE_TEMPLATE = "inplace.py.jinja"
FUSED_TEMPLATE = "fused.py.jinja"
# Pinned here so that output does not follow a user's black config; 120 columns, as symgrad's own code.
BLACK_MODE = black.Mode(line_length=120, target_versions={black.TargetVersion.PY310})


def builtin_template_dir() -> Path:
    """The templates shipped with symgrad.

    The top-level ``templates/`` folder is mapped into the wheel as ``symgrad/templates``;
    in a source checkout (and an editable install) it sits beside the package.
    """
    package = Path(str(resources.files("symgrad")))
    for candidate in (package / "templates", package.parent / "templates"):
        if (candidate / FUNCTION_TEMPLATE).is_file():
            return candidate
    raise SymgradError(f"symgrad's templates are missing (looked in {package / 'templates'})")


def template_dir(override: str | None) -> Path:
    """The directory to load templates from: ``--templates`` if given, else the built-in one."""
    if override is None:
        return builtin_template_dir()
    path = Path(override)
    if not path.is_dir():
        raise SymgradError(f"--templates {override!r} is not a directory")
    return path


def template_name(plan: Plan) -> str:
    if plan.inplace:
        return INPLACE_TEMPLATE
    return FUSED_TEMPLATE if plan.fused is not None else FUNCTION_TEMPLATE


def template_fingerprint(directory: Path, name: str) -> str:
    """A short hash of the template ``name`` in ``directory``, and of the templates it
    imports or includes (``_macros.jinja``), transitively.

    Only those templates count, so editing another template does not make every generated
    file stale. A template that uses no other hashes as its text alone (as before macros
    existed, so a custom single-file template keeps its fingerprint). Line endings are
    normalised, so a checkout that converts them does not make files stale either.
    """
    digest = hashlib.sha256()
    for index, used in enumerate((name, *_templates_used_by(directory, name))):
        text = (directory / used).read_bytes().replace(b"\r\n", b"\n")
        digest.update((b"\0" if index else b"") + used.encode() + b"\0" + text)
    return digest.hexdigest()[:16]


def _templates_used_by(directory: Path, name: str) -> list[str]:
    """The templates ``name`` imports, includes or extends, directly or through another, in
    name order (those with a name known before rendering, and present in ``directory``)."""
    environment = jinja2.Environment()
    found: set[str] = set()
    pending = [name]
    while pending:
        source = (directory / pending.pop()).read_text(encoding="utf-8")
        try:
            referenced = jinja2.meta.find_referenced_templates(environment.parse(source))
        except jinja2.TemplateSyntaxError:
            continue  # (render reports it)
        for used in referenced:
            if used is not None and used != name and used not in found and (directory / used).is_file():
                found.add(used)
                pending.append(used)
    return sorted(found)


def render(plan: Plan, directory: Path) -> str:
    """The module body for ``plan``, formatted by black (no header)."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    name = template_name(plan)
    try:
        source = environment.get_template(name).render(plan=plan)
    except jinja2.TemplateNotFound as exc:
        # (or a template it imports, such as _macros.jinja, missing from a custom folder)
        raise SymgradError(f"template {exc.name!r} not found in {directory}") from None
    except jinja2.TemplateError as exc:
        raise SymgradError(f"template {name!r} failed: {exc}") from None
    try:
        formatted = black.format_str(source, mode=BLACK_MODE)
    except black.InvalidInput as exc:
        raise SymgradError(f"template {name!r} produced invalid Python: {str(exc).splitlines()[0]}") from None
    _check_contract(plan, formatted, name)
    return formatted


def _check_contract(plan: Plan, source: str, name: str) -> None:
    """Refuse a module that a custom (or older) template got wrong in ways that would only
    show at run time: a helper its code calls but it does not define (plan.helpers),
    a fused runner without the ``operations`` its calls pass, or an in-place forward in the
    torch.compile twin (plan.compiled_forward)."""
    tree = ast.parse(source)
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    undefined = sorted((called & set(HELPERS)) - defined)
    if undefined:
        raise SymgradError(
            f"template {name!r} calls {undefined[0]} without defining it: print plan.helpers"
            f" (see symgrad's templates/{name})"
        )
    runner = plan.fused and next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == plan.fused.runner), None)
    if runner and not _takes_keyword(runner, "operations"):
        raise SymgradError(
            f"template {name!r} defines {plan.fused.runner} without the operations= argument its calls"
            f" pass: def {plan.fused.runner}(body, *args, operations) (see symgrad's templates/fused.py.jinja)"
        )
    if plan.compiled_forward is None:
        return
    twin = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == plan.no_jvp_class), None)
    forward = twin and next((n for n in twin.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None or any(_is_in_place_call(node) for node in ast.walk(forward)):
        raise SymgradError(
            f"template {name!r} does not give {plan.no_jvp_class} the out-of-place forward:"
            " print plan.compiled_forward there (see symgrad's templates/_macros.jinja)"
        )


def _takes_keyword(function: ast.FunctionDef, keyword: str) -> bool:
    """Whether ``function(body, *args, keyword=...)`` binds: a keyword-only or ``**`` parameter."""
    arguments = function.args
    return arguments.kwarg is not None or keyword in [a.arg for a in arguments.kwonlyargs]


def _is_in_place_call(node: ast.AST) -> bool:
    """``a.add_(b)`` and the like: a method call whose name ends in one underscore."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    method = node.func.attr
    return method.endswith("_") and not method.endswith("__") and not method.startswith("_")
