"""Many functions at once: `symgrad build` from the `[tool.symgrad]` table (issue 3).

The CLI runs in-process (``symgrad.cli.main.main``) from a temporary working directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from symgrad import Spec, SymgradError, generate_source
from symgrad.cli.config import load_targets
from symgrad.codegen.render import builtin_template_dir
from symgrad.codegen.write import read_spec

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """\
[project]
name = "demo"

[tool.symgrad]
out = "ops"

[[tool.symgrad.functions]]
name = "Blend"
expr = "alpha*x*y + log(1 + y**2)*exp(-x)"
params = ["alpha"]
domain = { y = [-2, 2], x = [0.5, 3.0] }

[[tool.symgrad.functions]]
name = "RoundSTE"
expr = "floor(x + 1/2)"
grad = { x = "1" }

[[tool.symgrad.functions]]
name = "Pair"
expr = "x*y, x+y"
inputs = ["y", "x"]

[[tool.symgrad.functions]]
name = "Exp_"
expr = "exp(x)"
inplace = true
out = "inplace_ops"
"""

# What the equivalent `symgrad EXPR --name NAME ...` commands record.
SPECS = {
    "ops/blend.py": Spec(
        expr="alpha*x*y + log(1 + y**2)*exp(-x)",
        name="Blend",
        params=("alpha",),
        domain=(("x", 0.5, 3.0), ("y", -2.0, 2.0)),
    ),
    "ops/round_ste.py": Spec(expr="floor(x + 1/2)", name="RoundSTE", grads=(("x", "1"),)),
    "ops/pair.py": Spec(expr="x*y, x+y", name="Pair", inputs=("y", "x")),
    "inplace_ops/exp_.py": Spec(expr="exp(x)", name="Exp_", inplace=True),
}


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    return tmp_path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.rglob("*")) if p.is_file()
    }


def lines(status: str, paths=SPECS) -> str:
    return "".join(f"{status} {path}\n" for path in paths)


def test_build_generates_every_declared_function(cli, project):
    assert cli("build") == (0, lines("created"), "")
    for path, spec in SPECS.items():
        text = (project / path).read_text()
        assert read_spec(text) == spec
        assert (project / Path(path).parent / "__init__.py").is_file()
    # The same bytes as the equivalent command line.
    assert cli("x*y, x+y", "--name", "Pair", "--inputs", "y,x", "--stdout")[1] == (project / "ops/pair.py").read_text()


def test_build_writes_only_changed_files(cli, project):
    assert cli("build")[0] == 0
    before = snapshot(project)
    assert cli("build") == (0, lines("unchanged"), "")
    assert snapshot(project) == before

    config = project / "pyproject.toml"
    config.write_text(config.read_text().replace('expr = "exp(x)"', 'expr = "exp(2*x)"'))
    code, out, _ = cli("build")
    assert code == 0
    assert out.splitlines() == [
        "unchanged ops/blend.py",
        "unchanged ops/round_ste.py",
        "unchanged ops/pair.py",
        "updated inplace_ops/exp_.py",
    ]
    after = snapshot(project)
    assert all(after[p] == before[p] for p in SPECS if p != "inplace_ops/exp_.py")
    assert read_spec((project / "inplace_ops/exp_.py").read_text()).expr == "exp(2*x)"


def test_regen_and_check_work_on_build_output(cli, project):
    assert cli("build")[0] == 0
    before = snapshot(project)
    assert cli("check", "ops") == (0, "3 files up to date\n", "")
    assert cli("regen", "inplace_ops") == (0, "unchanged inplace_ops/exp_.py\n", "")
    assert snapshot(project) == before


def test_build_check(cli, project):
    assert cli("build")[0] == 0
    assert cli("build", "--check") == (0, "4 files up to date\n", "")
    config = project / "pyproject.toml"
    config.write_text(
        config.read_text().replace('"x*y, x+y"', '"x*y, x-y"')
        + '\n[[tool.symgrad.functions]]\nname = "Square"\nexpr = "x**2"\n'
    )
    before = snapshot(project)
    code, out, _ = cli("build", "--check")
    assert code == 1
    assert "would update ops/pair.py; fix: symgrad build --config pyproject.toml" in out
    assert "+f1(y, x) = x - y" in out or "x - y" in out  # part of the diff
    assert "would create ops/square.py; fix: symgrad build --config pyproject.toml" in out
    assert out.splitlines()[-1].startswith("2 of 5 files would change")
    assert snapshot(project) == before


def test_build_refuses_hand_edits_and_foreign_files(cli, project):
    assert cli("build")[0] == 0
    pair = project / "ops" / "pair.py"
    pair.write_text(pair.read_text() + "# my note\n")
    foreign = project / "ops" / "round_ste.py"
    foreign.write_text("def round_ste(x):\n    return x\n")
    config = project / "pyproject.toml"
    config.write_text(config.read_text().replace("floor(x + 1/2)", "floor(x)").replace("x*y, x+y", "x*y, x-y"))
    protected = {p: v for p, v in snapshot(project).items() if p in ("ops/pair.py", "ops/round_ste.py")}

    code, out, err = cli("build")
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "unchanged ops/blend.py",
        "refused ops/round_ste.py: it was not written by symgrad (such a file is never overwritten, even with --force)",
        "refused ops/pair.py: it was edited by hand since symgrad wrote it (use --force to overwrite it)",
        "unchanged inplace_ops/exp_.py",
    ]
    code, out, _ = cli("build", "--force")
    assert code == 1
    assert "updated ops/pair.py" in out and "refused ops/round_ste.py" in out
    assert foreign.read_bytes() == protected["ops/round_ste.py"][0]
    assert read_spec(pair.read_text()).expr == "x*y, x-y"


def test_build_reports_a_failed_function_and_builds_the_rest(cli, project):
    config = project / "pyproject.toml"
    config.write_text(
        config.read_text() + '\n[[tool.symgrad.functions]]\nname = "Bad"\nexpr = "x*y, x+y"\ninplace = true\n'
    )
    code, out, err = cli("build")
    assert (code, err) == (1, "")
    assert out.splitlines()[:4] == lines("created").splitlines()
    assert out.splitlines()[4].startswith("failed ops/bad.py: ") and "single elementwise output" in out
    assert not (project / "ops" / "bad.py").exists()


def test_build_from_another_folder(cli, project, monkeypatch):
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    assert cli("build", "--config", "../pyproject.toml") == (0, lines("created", [f"../{p}" for p in SPECS]), "")
    assert (project / "ops" / "blend.py").is_file()


def test_build_with_templates(cli, project):
    style = project / "style"
    style.mkdir()
    for template in builtin_template_dir().glob("*.jinja"):
        (style / template.name).write_text(template.read_text().replace("\nimport torch\n", "\nimport torch  # ours\n"))
    config = project / "pyproject.toml"
    config.write_text(config.read_text().replace('out = "ops"\n', 'out = "ops"\ntemplates = "style"\n', 1))
    assert cli("build")[0] == 0
    text = (project / "ops" / "blend.py").read_text()
    assert "import torch  # ours\n" in text and read_spec(text).templates == "../style"
    assert read_spec((project / "inplace_ops" / "exp_.py").read_text()).templates == "../style"
    assert cli("check", "ops")[0] == 0 and cli("check", "inplace_ops")[0] == 0


BAD_CONFIGS = [
    (None, "pyproject.toml: no such file"),
    ("[project]\nname = 'demo'\n", "no [tool.symgrad] table"),
    ("tool = 1\n", "no [tool.symgrad] table"),
    ("[tool.symgrad\n", "invalid TOML"),
    ("[tool.symgrad]\nout = 'ops'\n", "declares no [[tool.symgrad.functions]]"),
    ("[tool.symgrad]\nfunctions = 3\n", "declare functions as [[tool.symgrad.functions]] tables"),
    ("[tool.symgrad]\ncolour = 1\n", "unknown key 'colour'"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\n", "#2 (Sq): 'expr' is required"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\nexpresion = 'x'\n", "unknown key 'expresion'"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\ninputs = 'x'\n", "'inputs' must be a list of names"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\ndomain = { x = [1] }\n", "domain.x must be [LOW, HIGH]"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\ndomain = { x = [3, 1] }\n", "finite LOW < HIGH"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\ngrad = { x = 1 }\n", "'grad' must be a table"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\ninplace = 'yes'\n", "'inplace' must be true or false"),
    ("[[tool.symgrad.functions]]\nname = 'square'\nexpr = 'x**2'\n", "upper-case letter"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\nsave = 'fast'\n", "save='fast': expected one of memory, speed"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\nsave = 1\n", "'save' must be a non-empty string"),
    ("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x'\ntemplates = 'nowhere'\n", "is not a directory"),
    (
        "[[tool.symgrad.functions]]\nname = 'SiLU'\nexpr = 'x'\n[[tool.symgrad.functions]]\nname = 'SiLu'\nexpr = 'x'\n",
        "functions 'SiLU' and 'SiLu' would both write generated/si_lu.py",
    ),
]


@pytest.mark.parametrize("config, fragment", BAD_CONFIGS, ids=[f for _, f in BAD_CONFIGS])
def test_bad_config_writes_nothing(cli, tmp_path, config, fragment):
    # A valid function first: a mistake anywhere must stop the whole build.
    if config is not None:
        first = "[[tool.symgrad.functions]]\nname = 'Cube'\nexpr = 'x**3'\n" if config.startswith("[[") else ""
        (tmp_path / "pyproject.toml").write_text(first + config)
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "keep.py").write_text("# a user's own file\n")
    before = snapshot(tmp_path)
    code, out, err = cli("build")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith("symgrad: error: ") and fragment in err, err
    assert err.count("pyproject.toml") <= 1, err  # (the location once: it was twice, a user hunt)
    assert snapshot(tmp_path) == before


def test_build_refuses_a_module_written_for_another_name(cli, tmp_path):
    assert cli("sin(x)", "--name", "Foo_Bar")[0] == 0  # generated/foo_bar.py, by the CLI
    (tmp_path / "pyproject.toml").write_text("[[tool.symgrad.functions]]\nname = 'FooBar'\nexpr = 'exp(x)'\n")
    before = snapshot(tmp_path)
    assert cli("build") == (
        1,
        "refused generated/foo_bar.py: it holds Foo_Bar, another function with the same module name"
        " (use --force to replace it)\n",
        "",
    )
    assert snapshot(tmp_path) == before
    assert cli("build", "--force") == (0, "updated generated/foo_bar.py\n", "")
    assert read_spec((tmp_path / "generated" / "foo_bar.py").read_text()).name == "FooBar"


def test_config_that_is_not_utf8_is_refused(cli, tmp_path):
    (tmp_path / "pyproject.toml").write_bytes("[[tool.symgrad.functions]]\nname = 'Sq'\nexpr = 'x**2'\n".encode("utf-16"))
    before = snapshot(tmp_path)
    code, out, err = cli("build")
    assert (code, out) == (2, "")
    assert err.startswith("symgrad: error: ") and "invalid TOML: not UTF-8" in err and len(err.splitlines()) == 1, err
    assert snapshot(tmp_path) == before


def test_build_usage_error(cli, project):
    before = snapshot(project)
    code, out, err = cli("build", "--config")
    assert (code, out) == (2, "") and err.startswith("symgrad: error: ") and len(err.splitlines()) == 1
    assert snapshot(project) == before


def test_repository_table_declares_exactly_generated(tmp_path):
    """The project's own [tool.symgrad] table matches generated/ file for file, spec for spec,
    so that `symgrad build` and `symgrad regen generated` agree."""
    targets = load_targets(ROOT / "pyproject.toml")
    declared = {target.path.resolve(): target.spec for target in targets}
    recorded = {
        path.resolve(): read_spec(path.read_text())
        for path in sorted((ROOT / "generated").glob("*.py"))
        if path.name != "__init__.py"
    }
    assert declared == recorded


def test_api_generate_source_matches_build(cli, project):
    assert cli("build")[0] == 0
    expected = generate_source("floor(x + 1/2)", "RoundSTE", grads={"x": "1"})
    assert (project / "ops" / "round_ste.py").read_text() == expected


def test_config_paths_are_relative_to_the_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    targets = load_targets(tmp_path / "pyproject.toml")
    assert [t.path for t in targets] == [tmp_path / p for p in SPECS]
    assert [t.spec for t in targets] == list(SPECS.values())


def test_fast_is_a_table_default_and_a_function_key(tmp_path):
    """`fast = true` in [tool.symgrad] is every function's default; a function's own key wins."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.symgrad]\nfast = true\n"
        "[[tool.symgrad.functions]]\nname = 'Cube'\nexpr = 'x**3'\n"
        "[[tool.symgrad.functions]]\nname = 'Plain'\nexpr = 'x**3'\nfast = false\n"
    )
    cube, plain = load_targets(tmp_path / "pyproject.toml")
    assert cube.spec.fast and not plain.spec.fast
    (tmp_path / "pyproject.toml").write_text("[tool.symgrad]\nfast = 'yes'\n[[tool.symgrad.functions]]\nname = 'C'\nexpr = 'x'\n")
    with pytest.raises(SymgradError, match="'fast' must be true or false"):
        load_targets(tmp_path / "pyproject.toml")
