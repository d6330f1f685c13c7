"""The command line and the Python API: success paths and every error path.

Error contract: exit code 2, exactly one line `symgrad: error: ...` on stderr (a syntax
error adds the expression and a caret below it), and nothing written or changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import symgrad
from symgrad import SymgradError, generate_source

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "symgrad", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_generate_writes_module_and_package(tmp_path):
    result = run("sqrt(x)+1/x", "--name", "SqrtInverse", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(Path("generated") / "sqrt_inverse.py")
    assert (tmp_path / "generated" / "__init__.py").is_file()
    source = (tmp_path / "generated" / "sqrt_inverse.py").read_text()
    assert "class SqrtInverse(" in source and "def sqrt_inverse(x):" in source
    # Generated modules import only torch (and the standard library's inspect, to set
    # forward's signature once).
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import inspect", "import torch"]


def test_generated_module_runs_like_the_readme(tmp_path):
    assert run("sqrt(x)+1/x", "--name", "SqrtInverse", cwd=tmp_path).returncode == 0
    code = "import torch; from generated.sqrt_inverse import SqrtInverse; print(SqrtInverse.apply(torch.tensor([4.0])))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "2.2500" in result.stdout  # sqrt(4) + 1/4


def _run_command_and_report(args: list[str], report: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command as its console script runs it (symgrad.cli.run), then ``report``, an
    expression printed to stderr at exit."""
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print({report}, file=sys.stderr))\n"
        f"sys.argv = ['symgrad', *{args!r}]\n"
        "from symgrad.cli import run\n"
        "run()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_command_imports_neither_torch_nor_sympy_units(tmp_path):
    """Generating costs little more than importing sympy, jinja2 and black: torch is not
    imported, nor sympy.physics.units, which sympy.simplify imports only to look for a
    physical Quantity (0.4 s of a 1.8 s run, symgrad.cli.main._skip_sympy_units_import). The
    module is the same as the library writes, which imports the real sympy.physics.units."""
    args = ["log(1+exp(x))*sqrt(x)+1/x", "--name", "Case", "--stdout"]
    report = "type(sys.modules.get('sympy.physics.units')).__name__, 'torch' in sys.modules"
    result = _run_command_and_report(args, report, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "_SympyUnitsStandIn False"
    assert result.stdout.rstrip("\n") == generate_source("log(1+exp(x))*sqrt(x)+1/x", "Case").rstrip("\n")


def test_sympy_units_stand_in_hands_out_the_real_module():
    """Any other name imported from it (SymPy's checksol imports Unit) is the real
    module's, imported on first use."""
    code = (
        "import sys\n"
        "from symgrad.cli.main import _skip_sympy_units_import\n"
        "_skip_sympy_units_import()\n"
        "from sympy.physics.units import kilo, meter\n"
        "assert type(sys.modules['sympy.physics.units']).__name__ == 'module'\n"
        "from sympy.physics.units.quantities import Quantity\n"
        "assert isinstance(meter, Quantity) and kilo * meter == 1000 * meter\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_out_and_stdout(tmp_path):
    result = run("x**2", "--name", "Square", "--out", "custom/dir", cwd=tmp_path)
    assert result.returncode == 0 and (tmp_path / "custom" / "dir" / "square.py").is_file()
    printed = run("x**2", "--name", "Square", "--stdout", cwd=tmp_path)
    assert printed.returncode == 0
    assert printed.stdout == (tmp_path / "custom" / "dir" / "square.py").read_text()
    assert not (tmp_path / "generated").exists()


def test_api_matches_cli(tmp_path):
    run("x*y + p", "--name", "Affine", "--params", "p", cwd=tmp_path)
    assert generate_source("x*y + p", "Affine", params=["p"]) == (tmp_path / "generated" / "affine.py").read_text()


def test_inputs_order_and_params():
    source = generate_source("a*b + c", "Order", inputs=["b", "a"], params=["c"])
    assert "def order(b, a, c):" in source


def test_user_symbols_named_like_generated_code():
    names = ["ctx", "grad_output", "result", "self", "input", "t0", "x0", "len", "isinstance", "sum"]
    source = generate_source("+".join(f"{n}**2" for n in names) + "+torch", "Collide")
    # The public signature keeps every user name Python allows; only `torch` is renamed.
    signature = next(line for line in source.splitlines() if line.startswith("def collide("))
    for name in names:
        assert f"{name}," in signature or f"{name})" in signature
    assert "torch_" in signature
    namespace: dict = {}
    exec(compile(source, "collide.py", "exec"), namespace)
    import torch

    args = [torch.tensor([1.5], dtype=torch.float64, requires_grad=True) for _ in range(len(names) + 1)]
    assert torch.autograd.gradcheck(namespace["collide"], args)


def test_symgrad_error_is_value_error():
    assert issubclass(SymgradError, ValueError)
    with pytest.raises(SymgradError, match="unknown function 'sqr'; did you mean sqrt"):
        generate_source("sqr(x)", "Bad")


def test_unknown_api_option():
    with pytest.raises(SymgradError, match="unknown option 'colour'"):
        generate_source("x", "Bad", colour=True)


ERROR_CASES = [
    (["sqr(x)", "--name", "Bad"], "unknown function 'sqr'"),
    (["x +* 2", "--name", "Bad"], "invalid syntax"),
    (["__import__('os').system('echo hacked')", "--name", "Bad"], "only calls of supported functions"),
    (["x.real", "--name", "Bad"], "attribute access"),
    (["x*y", "--name", "Bad", "--inputs", "x"], "neither an input nor a param"),
    (["x*y", "--name", "Bad", "--inputs", "x,z"], "does not use"),
    (["x*y", "--name", "Bad", "--inputs", "x,y", "--params", "y"], "both --inputs and --params"),
    (["x*y", "--name", "Bad", "--inputs", "x,,y"], "comma-separated"),
    (["x", "--name", "A;import os"], "not a valid class name"),
    (["x", "--name", "class"], "not a valid class name"),
    (["x", "--name", "square"], "upper-case letter"),
    (["x", "--name", "Import"], "cannot import"),
    (["x", "--name", "Any"], "gives the functional alias 'any', which would shadow Python's builtin 'any'"),
    (["x", "--name", "Isinstance"], "would shadow Python's builtin 'isinstance'"),
    (["x", "--name", "Torch"], "would shadow the module's import 'torch'"),
    (["x", "--name", "Inspect"], "would shadow the module's import 'inspect'"),
    (["x", "--name", "RuntimeError", "--inplace"], "'RuntimeError' would shadow Python's builtin 'RuntimeError'"),
    (["x**2", "--name", "Sq", "--domain", "x=1"], "NAME=LOW:HIGH"),
    (["x**2", "--name", "Sq", "--domain", "x=3:1"], "LOW < HIGH"),
    (["x**2", "--name", "Sq", "--domain", "z=0:1"], "not an input or param"),
    # A given interval must keep the function and its gradients real and finite; the
    # intervals derived beside it, too.
    (["log(x)", "--name", "Log", "--domain", "x=-1:20"], "not real and finite at x="),
    (["exp(x) + log(y - 10)", "--name", "Mixed", "--domain", "x=-20:20"], "finite with the given --domain x=-20:20 for 'y'"),
    (["x**2", "--name", "Sq", "--grad", "x"], "NAME=EXPR"),
    (["x**2", "--name", "Sq", "--grad", "z=1"], "not a differentiable input"),
    (["x*y, x+y", "--name", "Sq", "--grad", "x=1"], "single elementwise output"),
    (["x*y, x+y", "--name", "Sq", "--inplace"], "single elementwise output"),
    (["floor(x)", "--name", "Floor"], "piecewise constant"),
    (["p*2", "--name", "OnlyParam", "--params", "p"], "no differentiable input"),
    (["x - x + 1", "--name", "Constant"], "no differentiable input"),
    (["Max(2, acos(1/2) - abs(x))", "--name", "Constant"], "is constant (2) for every input"),
    (["x*y - x*y + y, x - x", "--name", "Constant", "--inputs", "x,y"], "output 2 does not depend on any input"),
    (["log(x)", "--name", "Log", "--templates", "/nonexistent"], "not a directory"),
    (["x", "--name", "Typo", "--colour"], "unrecognized arguments"),
    (["exp(x)", "--name", "Fast", "--save", "fast"], "invalid choice: 'fast'"),
    (["exp(x)", "--name", "Both", "--save", "speed", "--inplace"], "--save speed and --inplace cannot be combined"),
    (["x"], "--name"),
    # symgrad report: a path that is not a symgrad module, an expression that does not parse
    (["report", "missing.py"], "missing.py is not a file"),
    (["report", "generated/keep.py"], "not a symgrad module"),
    (["report", "log(1+", "--name", "Bad"], "invalid syntax"),
    (["report", "sqr(x)", "--name", "Bad"], "unknown function 'sqr'"),
    (["report", "exp(x)"], "give its class name with --name"),
    (["report", "x/y"], "give its class name with --name"),
    (["report", "exp(x)", "--name", "E", "--size", "0"], "must be at least 1"),
    (["report", "exp(x)", "--name", "E", "--colour"], "unrecognized arguments"),
]


@pytest.mark.parametrize("args, fragment", ERROR_CASES, ids=[" ".join(a) for a, _ in ERROR_CASES])
def test_error_path(tmp_path, args, fragment):
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "keep.py").write_text("# a user's own file\n")
    before = snapshot(tmp_path)
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("symgrad: error: ") and fragment in lines[0], result.stderr
    if "invalid syntax" in lines[0]:
        assert len(lines) == 3 and lines[2].strip() == "^"  # the caret block
    else:
        assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before


def test_shadowed_names_cover_what_generated_modules_read(tmp_path):
    """naming.SHADOWED lists every global a generated module reads that a class or alias could
    shadow: the builtins and imports that generated/ (every mode) reads."""
    import ast
    import builtins

    from symgrad.naming import SHADOWED

    read = set()
    for path in (Path(__file__).parent.parent / "generated").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in dir(builtins):
                read.add(node.id)
    assert read and read | {"torch", "inspect"} == SHADOWED
    for name in ("Max", "Abs", "Sum", "Round"):  # (builtins no module reads: those names work)
        assert run("x", "--name", name, "--stdout", cwd=tmp_path).returncode == 0


def test_syntax_error_caret_column(tmp_path):
    result = run("sin(x) + * 2", "--name", "Bad", cwd=tmp_path)
    message, expression, caret = result.stderr.splitlines()
    column = int(message.split("column ")[1].split(":")[0])
    assert expression.strip() == "sin(x) + * 2"
    assert caret.index("^") - expression.index("s") == column - 1
    assert expression[expression.index("s") + column - 1] == "*"


def test_list_functions(tmp_path):
    result = run("--list-functions", cwd=tmp_path)
    assert result.returncode == 0
    for name in ("sqrt", "Max", "Piecewise", "loggamma", "sum"):
        assert any(line.startswith(name + " ") for line in result.stdout.splitlines())


def test_version():
    assert symgrad.__version__ in generate_source("x**2", "Square").splitlines()[0]


def test_readme_example_is_what_symgrad_writes():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nclass _ExpNoJvp") + len("```python\n")
    example = readme[start : readme.index("```", start)]
    assert example in generate_source("exp(x)", "Exp")
    assert example in (ROOT / "generated" / "exp.py").read_text()


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = readme.split("## Test", 1)[1].split("```")[1].strip()
    assert test_command in ci.splitlines()
