"""Regenerate after edits: the recorded spec, `symgrad regen`, `symgrad check`, hand-edit
protection, atomic writes and `--templates` (issue 3).

The CLI runs in-process (``symgrad.cli.main.main``) from a temporary working directory: the
same code as the ``symgrad`` command, without paying for a fresh interpreter per call.

Error contract, as in test_cli.py: exit code 2, exactly one line `symgrad: error: ...` on
stderr, nothing written or changed.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
from pathlib import Path

import pytest

from symgrad import Spec, generate_source
from symgrad.cli.main import main
from symgrad.codegen import write as write_module
from symgrad.codegen.render import builtin_template_dir, template_fingerprint
from symgrad.codegen.write import content_hash, is_hand_edited, read_spec

ROOT = Path(__file__).resolve().parent.parent


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and inode: a rewrite with equal bytes still shows (os.replace)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.rglob("*")) if p.is_file()
    }


def assert_error(result: tuple[int, str, str], fragment: str) -> None:
    code, out, err = result
    assert code == 2, (out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("symgrad: error: "), err
    assert fragment in lines[0], err


def make_stale(path: Path) -> None:
    """Rewrite ``path`` as an older symgrad would have: other content, but a valid hash."""
    text = path.read_text().replace("import torch\n", "import torch  # written by an older symgrad\n", 1)
    old_hash = text.splitlines()[5]
    assert old_hash.startswith("# symgrad-sha256: ")
    path.write_text(text.replace(old_hash, "# symgrad-sha256: " + content_hash(text)))
    assert not is_hand_edited(path.read_text())


# --- the recorded spec --------------------------------------------------------------------


def test_header_records_spec_banner_and_command(cli, tmp_path):
    args = ["a*b + c", "--name", "Affine", "--inputs", "b,a", "--params", "c", "--domain", "a=0.5:2", "--out", "ops"]
    assert cli(*args)[0] == 0
    text = (tmp_path / "ops" / "affine.py").read_text()
    lines = text.splitlines()
    assert "DO NOT EDIT BY HAND" in lines[0] and "symgrad regen" in lines[1]
    assert read_spec(text) == Spec(
        expr="a*b + c", name="Affine", inputs=("b", "a"), params=("c",), domain=(("a", 0.5, 2.0),)
    )
    assert lines[3].startswith("# symgrad-templates: ") and not is_hand_edited(text)
    # The banner's command rebuilds the file byte for byte.
    command = shlex.split(lines[2].lstrip("#").strip())
    assert command[0] == "symgrad"
    assert cli(*command[1:], "--out", "again")[0] == 0
    assert (tmp_path / "again" / "affine.py").read_text() == text


def test_stdout_writes_nothing(cli, tmp_path):
    code, out, err = cli("x**2", "--name", "Square", "--stdout")
    assert code == 0 and err == ""
    assert out == generate_source("x**2", "Square")
    assert list(tmp_path.iterdir()) == []


# --- regen and check ----------------------------------------------------------------------


def test_regen_and_check_when_up_to_date_write_nothing(cli, tmp_path):
    for expr, name in (("x**2", "Square"), ("x*y, x+y", "Pair")):
        assert cli(expr, "--name", name)[0] == 0
    (tmp_path / "generated" / "helpers.py").write_text("def helper():\n    return 1\n")  # a user's own module
    before = snapshot(tmp_path)
    code, out, err = cli("regen")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "skipped generated/helpers.py: not written by symgrad",
        "unchanged generated/pair.py",
        "unchanged generated/square.py",
    ]
    assert cli("check") == (0, "2 files up to date\n", "")
    assert snapshot(tmp_path) == before


def test_regen_updates_only_stale_files(cli, tmp_path):
    assert cli("x**2", "--name", "Square")[0] == 0
    assert cli("x**3", "--name", "Cube")[0] == 0
    make_stale(tmp_path / "generated" / "square.py")
    cube = snapshot(tmp_path / "generated")["cube.py"]

    code, out, _ = cli("check", "generated")
    assert code == 1
    assert "would update generated/square.py; fix: symgrad regen generated" in out
    assert "-import torch  # written by an older symgrad" in out and "+import torch" in out  # the diff
    assert "cube.py" not in out
    assert out.splitlines()[-1].startswith("1 of 2 files would change; run `symgrad regen generated`")

    assert cli("regen", "generated") == (0, "unchanged generated/cube.py\nupdated generated/square.py\n", "")
    assert (tmp_path / "generated" / "square.py").read_text() == generate_source("x**2", "Square")
    assert snapshot(tmp_path / "generated")["cube.py"] == cube  # not rewritten
    assert cli("check", "generated")[0] == 0


def test_edit_check_refuse_force_restore(cli, tmp_path):
    """The whole story: a hand edit is reported, protected, and only --force discards it."""
    assert cli("x**2", "--name", "Square")[0] == 0
    assert cli("exp(x)", "--name", "Exp")[0] == 0
    path = tmp_path / "generated" / "square.py"
    original = path.read_text()
    path.write_text(original.replace("import torch\n", "import torch\nimport numpy  # my tweak\n"))
    edited = snapshot(tmp_path)

    code, out, _ = cli("check")
    assert code == 1
    assert "generated/square.py was edited by hand; fix:" in out and "symgrad regen generated --force" in out
    assert "-import numpy  # my tweak" in out

    code, out, err = cli("regen")
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "unchanged generated/exp.py",
        "refused generated/square.py: it was edited by hand since symgrad wrote it (use --force to overwrite it)",
    ]
    assert snapshot(tmp_path) == edited

    assert_error(cli("x**2", "--name", "Square"), "generated/square.py: it was edited by hand")
    assert snapshot(tmp_path) == edited

    assert cli("regen", "--force") == (0, "unchanged generated/exp.py\nupdated generated/square.py\n", "")
    assert path.read_text() == original
    assert cli("check")[0] == 0


def test_rerun_with_changed_expression_updates_unedited_file(cli, tmp_path):
    assert cli("x**2", "--name", "Square")[0] == 0
    assert cli("x**2 + 1", "--name", "Square") == (0, "generated/square.py\n", "")
    text = (tmp_path / "generated" / "square.py").read_text()
    assert read_spec(text).expr == "x**2 + 1" and text == generate_source("x**2 + 1", "Square")


def test_rerun_onto_hand_edited_file_needs_force(cli, tmp_path):
    assert cli("x**2", "--name", "Square")[0] == 0
    path = tmp_path / "generated" / "square.py"
    path.write_text(path.read_text() + "# my note\n")
    before = snapshot(tmp_path)
    assert_error(cli("x**3", "--name", "Square"), "edited by hand since symgrad wrote it (use --force")
    assert snapshot(tmp_path) == before
    assert cli("x**3", "--name", "Square", "--force")[0] == 0
    assert path.read_text() == generate_source("x**3", "Square")


def test_another_function_with_the_same_module_name_needs_force(cli, tmp_path):
    # FooBar and Foo_Bar both write foo_bar.py: the second replaced the first silently
    assert cli("exp(x)", "--name", "FooBar")[0] == 0
    path = tmp_path / "generated" / "foo_bar.py"
    before = snapshot(tmp_path)
    assert_error(
        cli("sin(x)", "--name", "Foo_Bar"),
        "refusing to overwrite generated/foo_bar.py: it holds FooBar, another function with the same module name"
        " (use --force to replace it)",
    )
    assert snapshot(tmp_path) == before
    assert cli("exp(x) + 1", "--name", "FooBar")[0] == 0  # the same function, changed: an update
    assert cli("sin(x)", "--name", "Foo_Bar", "--force")[0] == 0
    assert path.read_text() == generate_source("sin(x)", "Foo_Bar")


def test_hash_lookalike_in_body_counts_as_edit(cli, tmp_path):
    assert cli("x**2", "--name", "Square")[0] == 0
    path = tmp_path / "generated" / "square.py"
    text = path.read_text()
    path.write_text(text + "# symgrad-sha256: " + content_hash(text) + "\n")
    assert is_hand_edited(path.read_text())


@pytest.mark.parametrize(
    "content",
    ["def mine():\n    return 42\n", '# symgrad-spec: {"expr": broken\nx = 1\n', b"\xff\xfe not utf-8\n"],
    ids=["plain", "malformed-spec", "binary"],
)
def test_foreign_file_is_never_overwritten(cli, tmp_path, content):
    (tmp_path / "generated").mkdir()
    path = tmp_path / "generated" / "square.py"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        result = cli("x**2", "--name", "Square", *force)
        assert_error(result, "refusing to overwrite generated/square.py")
        assert snapshot(tmp_path) == before
    code, out, _ = cli("regen", "--force")
    assert snapshot(tmp_path) == before
    if content.startswith(b"# symgrad-spec" if isinstance(content, bytes) else "# symgrad-spec"):
        assert code == 1 and out.startswith("failed generated/square.py: cannot rebuild it: malformed symgrad-spec")
        assert cli("check")[0] == 1
    else:
        assert (code, out) == (0, "skipped generated/square.py: not written by symgrad\n")
        assert cli("check") == (0, "0 files up to date\n", "")


@pytest.mark.parametrize(
    "record, fragment",
    [
        ('{"expr": "x**2", "name": "Square", "colour": "red"}', "unknown field 'colour' (written by a newer symgrad?)"),
        ('{"expr": "x**2"}', "missing field 'name'"),
        ('{"expr": "x**2", "name": "Square", "inputs": "x"}', "'inputs' is not a list of names"),
        ('["x**2", "Square"]', "not an object"),
        ('{"expr": "x**2", "name": "Square", "save": "fast"}', "'save' is 'fast', not one of memory, speed"),
    ],
)
def test_malformed_spec_record(cli, tmp_path, record, fragment):
    assert cli("x**2", "--name", "Square")[0] == 0
    path = tmp_path / "generated" / "square.py"
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = "# symgrad-spec: " + record + "\n"
    path.write_text("".join(lines))
    before = snapshot(tmp_path)
    code, out, _ = cli("regen", "--force")
    assert (
        code == 1
        and out == f"failed generated/square.py: cannot rebuild it: malformed symgrad-spec record: {fragment}\n"
    )
    code, out, _ = cli("check")
    assert code == 1 and out.startswith(
        f"cannot rebuild generated/square.py: malformed symgrad-spec record: {fragment}"
    )
    assert_error(cli("x**2", "--name", "Square", "--force"), "not written by symgrad")
    assert snapshot(tmp_path) == before


def test_directory_in_the_way_is_refused(cli, tmp_path):
    (tmp_path / "generated" / "square.py").mkdir(parents=True)
    assert_error(cli("x**2", "--name", "Square", "--force"), "not a regular file")


def test_existing_folder_is_not_made_a_package(cli, tmp_path):
    # `--out .` wrote ./__init__.py, making the project root a package (a user-level hunt)
    assert cli("exp(x)", "--name", "Ex", "--out", ".")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex.py"]
    assert cli("exp(x)", "--name", "Ex", "--out", "new/sub")[0] == 0
    assert (tmp_path / "new" / "sub" / "__init__.py").is_file()


def test_update_keeps_permissions_and_symbolic_links(cli, tmp_path):
    assert cli("x**2", "--name", "Square", "--out", "real")[0] == 0
    real = tmp_path / "real" / "square.py"
    real.chmod(0o640)
    (tmp_path / "generated").mkdir()
    link = tmp_path / "generated" / "square.py"
    link.symlink_to(real)
    assert cli("x**3", "--name", "Square")[0] == 0
    assert link.is_symlink() and real.read_text() == generate_source("x**3", "Square")
    assert real.stat().st_mode & 0o777 == 0o640


# --- failed and interrupted writes ----------------------------------------------------------


def test_failed_generation_leaves_old_file(cli, tmp_path):
    assert cli("x**2", "--name", "Square")[0] == 0
    before = snapshot(tmp_path)
    assert_error(cli("x*y, x+y", "--name", "Square", "--inplace"), "single elementwise output")
    assert_error(cli("x**2", "--name", "Square", "--templates", "missing"), "is not a directory")
    assert snapshot(tmp_path) == before


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_failed_write_leaves_old_file(cli, tmp_path, monkeypatch, step):
    assert cli("x**2", "--name", "Square")[0] == 0
    before = snapshot(tmp_path)
    monkeypatch.setattr(write_module.os, step, _raise(OSError(28, "No space left on device")))
    assert_error(cli("x**3", "--name", "Square"), "cannot write generated/square.py: No space left on device")
    assert snapshot(tmp_path) == before  # no temporary file left behind either

    make_stale(tmp_path / "generated" / "square.py")
    stale = snapshot(tmp_path)
    code, out, _ = cli("regen")
    assert (
        code == 1 and out == "failed generated/square.py: cannot write generated/square.py: No space left on device\n"
    )
    assert snapshot(tmp_path) == stale


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_interrupted_write_leaves_old_file(cli, tmp_path, monkeypatch, step):
    assert cli("x**2", "--name", "Square")[0] == 0
    before = snapshot(tmp_path)
    monkeypatch.setattr(write_module.os, step, _raise(KeyboardInterrupt()))
    assert cli("x**3", "--name", "Square")[0] == 130
    assert snapshot(tmp_path) == before


# --- usage errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["regen", "nowhere"], "nowhere is not a directory"),
        (["check", "nowhere"], "nowhere is not a directory"),
        (["regen", "--frce"], "unrecognized arguments: --frce"),
        (["check", "--force"], "unrecognized arguments: --force"),
        (["regen", "a", "b"], "unrecognized arguments: b"),
    ],
)
def test_regen_check_usage_errors(cli, tmp_path, args, fragment):
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "keep.py").write_text("# a user's own file\n")
    before = snapshot(tmp_path)
    assert_error(cli(*args), fragment)
    assert snapshot(tmp_path) == before


# --- --templates --------------------------------------------------------------------------


def custom_templates(folder: Path, comment: str) -> Path:
    """A copy of the built-in templates whose modules carry ``comment`` after ``import torch``."""
    shutil.copytree(builtin_template_dir(), folder, dirs_exist_ok=True)
    assert "\nimport torch\n" in (folder / "function.py.jinja").read_text()
    for template in folder.glob("*.jinja"):
        text = template.read_text()
        template.write_text(text.replace("\nimport torch\n", f"\nimport torch  # {comment}\n", 1))
    return folder


def test_templates_override_is_recorded_and_reused(cli, tmp_path, monkeypatch):
    custom_templates(tmp_path / "style", "house style")
    assert cli("x**2", "--name", "Square", "--templates", "style", "--out", "pkg/ops")[0] == 0
    path = tmp_path / "pkg" / "ops" / "square.py"
    text = path.read_text()
    assert "import torch  # house style\n" in text
    assert read_spec(text).templates == "../../style"  # relative to the output folder
    assert "--templates ../../style --out ." in text.splitlines()[2]
    builtin = generate_source("x**2", "Square")
    assert text.splitlines()[3] != builtin.splitlines()[3]  # another template fingerprint

    # --stdout prints exactly the file that would be written.
    assert cli("x**2", "--name", "Square", "--templates", "style", "--out", "pkg/ops", "--stdout")[1] == text

    # regen and check find the override from any working directory.
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    assert cli("check", "../pkg/ops") == (0, "1 file up to date\n", "")
    assert cli("regen", "../pkg/ops") == (0, "unchanged ../pkg/ops/square.py\n", "")
    assert snapshot(tmp_path) == before

    # The banner's command, run from the output folder, rebuilds the file byte for byte.
    monkeypatch.chdir(path.parent)
    assert cli(*shlex.split(text.splitlines()[2].lstrip("#").strip())[1:]) == (0, "square.py\n", "")
    assert snapshot(tmp_path) == before

    # A changed template makes the file stale; regen applies it.
    monkeypatch.chdir(tmp_path)
    custom_templates(tmp_path / "style", "house style v2")
    code, out, _ = cli("check", "pkg/ops")
    assert code == 1 and "+import torch  # house style v2" in out
    assert cli("regen", "pkg/ops")[1] == "updated pkg/ops/square.py\n"
    assert "import torch  # house style v2\n" in path.read_text()


@pytest.mark.parametrize(
    ("args", "call"),
    [
        (("x**3", "Cube"), {}),
        (("alpha*x*y", "Blend"), {"params": ["alpha"]}),
        (("tanh(x)", "TanhFused"), {"fuse": True}),
        (("exp(x)", "Exp_"), {"inplace": True}),
    ],
)
def test_module_docstring_names_the_entry_point(args, call):
    """The module docstring describes the function and says what to call, not how it was made."""
    source = generate_source(*args, **call)
    docstring = source.split('"""')[1]
    alias = {"Cube": "cube(x)", "Blend": "blend(x, y, alpha)", "TanhFused": "tanh_fused(x)", "Exp_": "exp_(x)"}
    assert docstring.startswith(f"{args[1]}: ") and "symgrad" not in docstring.splitlines()[0]
    assert f"Call `{alias[args[1]]}`" in docstring
    assert "\nf(" in docstring  # the function itself


def test_fingerprint_covers_the_macros_a_template_imports(tmp_path):
    """Every built-in template imports _macros.jinja: a change there makes every module
    stale, as a change to the template itself does."""
    folder = custom_templates(tmp_path / "style", "house style")
    names = ("function.py.jinja", "fused.py.jinja", "inplace.py.jinja")
    before = [template_fingerprint(folder, name) for name in names]
    macros = folder / "_macros.jinja"
    macros.write_text(macros.read_text().replace("__symgrad__ =", "__symgrad__  =", 1))
    after = [template_fingerprint(folder, name) for name in names]
    assert all(b != a for b, a in zip(before, after))
    # A template that imports nothing hashes as its own text alone.
    (folder / "plain.jinja").write_text("x = 1\n")
    text = b"plain.jinja\0x = 1\n"
    assert template_fingerprint(folder, "plain.jinja") == hashlib.sha256(text).hexdigest()[:16]


def test_custom_templates_without_the_macros_are_refused(cli, tmp_path):
    folder = custom_templates(tmp_path / "old", "no macros")
    (folder / "_macros.jinja").unlink()
    assert_error(cli("x**2", "--name", "Square", "--templates", "old"), "template '_macros.jinja' not found in ")
    assert not (tmp_path / "generated").exists()


def test_missing_recorded_templates_fail_regen_and_check(cli, tmp_path):
    custom_templates(tmp_path / "style", "house style")
    assert cli("x**2", "--name", "Square", "--templates", "style")[0] == 0
    shutil.rmtree(tmp_path / "style")
    before = snapshot(tmp_path)
    code, out, _ = cli("regen")
    assert code == 1 and out.startswith("failed generated/square.py:") and "not a directory" in out
    code, out, _ = cli("check")
    assert code == 1 and out.startswith("cannot rebuild generated/square.py:")
    assert snapshot(tmp_path) == before


# --- the project's own generated/ -----------------------------------------------------------


def test_repository_generated_modules_are_up_to_date(capsys):
    """What CI runs: `symgrad check generated`. Fails until `symgrad regen generated` is run
    after a change to symgrad or its templates; the output says which files and why."""
    code = main(["check", str(ROOT / "generated")])
    assert code == 0, capsys.readouterr().out


def _without(folder: Path, template: str, start: str, end: str) -> None:
    """Cut the text from ``start`` up to (not including) ``end`` out of ``template``."""
    text = (folder / template).read_text()
    assert start in text and end in text
    (folder / template).write_text(text[: text.index(start)] + text[text.index(end) :])


def test_template_without_the_fused_helpers_is_refused(cli, tmp_path):
    """A custom (or pre-0.1 copy of) fused.py.jinja that does not print the helpers would
    write a module whose bodies call an undefined helper (_sigmoid; and _float32_for_half,
    in every body of more than one operation): refused, nothing written."""
    folder = custom_templates(tmp_path / "old", "before helpers")
    _without(folder, "fused.py.jinja", "{% for line in plan.helpers %}", "{{ m.function(plan.fused.forward_name")
    assert_error(
        cli("tanh(x)", "--name", "TanhFused", "--fuse", "--templates", "old"),
        "template 'fused.py.jinja' calls _float32_for_half without defining it: print plan.helpers"
        " (see symgrad's templates/fused.py.jinja)",
    )
    assert not (tmp_path / "generated" / "tanh_fused.py").exists()
    # (one operation per body, no sigmoid: no helper)
    assert cli("exp(x)", "--name", "ExpFused", "--fuse", "--templates", "old")[0] == 0


def test_fused_template_printing_the_older_fused_helpers_still_works(cli, tmp_path):
    """Fused templates written before every module had helpers print plan.fused.helpers,
    which holds the same lines."""
    folder = custom_templates(tmp_path / "old", "fused helpers")
    text = (folder / "fused.py.jinja").read_text()
    (folder / "fused.py.jinja").write_text(text.replace("{% for line in plan.helpers %}", "{% for line in plan.fused.helpers %}"))
    assert cli("tanh(x)", "--name", "TanhFused", "--fuse", "--templates", "old")[0] == 0
    assert "def _sigmoid(u):" in (tmp_path / "generated" / "tanh_fused.py").read_text()


def test_function_template_without_helpers_is_refused_where_one_is_called(cli, tmp_path):
    """log_ndtr and erfcx print as module-level helpers (printer.HELPERS) in every module:
    a custom function.py.jinja from before them is refused where the module calls one."""
    folder = custom_templates(tmp_path / "old", "before helpers")
    _without(folder, "function.py.jinja", "{% for line in plan.helpers %}", "{{ m.autograd_function(plan) }}")
    assert_error(
        cli("log(erfc(x))", "--name", "LogErfc", "--templates", "old"),
        "template 'function.py.jinja' calls _erfcx without defining it: print plan.helpers",
    )
    assert not (tmp_path / "generated" / "log_erfc.py").exists()
    assert cli("exp(x)", "--name", "Exp", "--templates", "old")[0] == 0  # (one operation per body)


@pytest.mark.parametrize("parameters", ["body, *args", "body, operations, *args"])
def test_fused_template_whose_runner_takes_no_operations_is_refused(parameters, cli, tmp_path):
    """A copy of fused.py.jinja from before the small-tensor rule defines _fused(body, *args):
    every call, which now passes operations=, would raise TypeError (as it would with
    operations before *args: "multiple values"). Refused, nothing written."""
    folder = custom_templates(tmp_path / "old", "before operations")
    text = (folder / "fused.py.jinja").read_text()
    new_runner = "def {{ plan.fused.runner }}(body, *args, operations):"
    assert new_runner in text
    (folder / "fused.py.jinja").write_text(text.replace(new_runner, f"def {{{{ plan.fused.runner }}}}({parameters}):"))
    assert_error(
        cli("x**3", "--name", "Cube", "--fuse", "--templates", "old"),
        "template 'fused.py.jinja' defines _fused without the operations= argument its calls pass",
    )
    assert not (tmp_path / "generated" / "cube.py").exists()


def test_template_with_an_in_place_compile_twin_is_refused(cli, tmp_path):
    """A custom function.py.jinja that gives the torch.compile twin --fast's in-place forward
    (plan.forward, not plan.compiled_forward) brings back torch 2.11's zero gradients."""
    folder = custom_templates(tmp_path / "old", "in-place twin")
    text = (folder / "_macros.jinja").read_text()
    assert '{{ static("forward", plan.compiled_forward or plan.forward) }}' in text
    (folder / "_macros.jinja").write_text(text.replace("plan.compiled_forward or plan.forward", "plan.forward"))
    assert_error(
        cli("x/2*(1+erf(x/sqrt(2)))", "--name", "GELU", "--fast", "--templates", "old"),
        "template 'function.py.jinja' does not give _GELUNoJvp the out-of-place forward",
    )
    assert not (tmp_path / "generated" / "gelu.py").exists()
    assert cli("x**2", "--name", "Square", "--templates", "old")[0] == 0  # (nothing in place: one forward)
