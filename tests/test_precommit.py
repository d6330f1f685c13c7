"""The pre-commit hooks in .pre-commit-hooks.yaml: each entry run as pre-commit runs it
(the entry's words, then the hook's args; no file names, as pass_filenames is false), in
a project with a clean generated module and then with a hand-edited one. No network: the
entry runs with this interpreter's symgrad instead of a hook environment."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOKS_FILE = ROOT / ".pre-commit-hooks.yaml"


def read_hooks(text: str) -> dict[str, dict]:
    """The hooks of a .pre-commit-hooks.yaml, by id: the flat subset of YAML it uses (a
    list of mappings of scalars and [a, b] lists), read without a YAML library."""
    hooks: list[dict] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("- "):
            hooks.append({})
            line = line[2:]
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            hooks[-1][key] = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        else:
            hooks[-1][key] = {"true": True, "false": False}.get(value, value)
    return {hook["id"]: hook for hook in hooks}


HOOKS = read_hooks(HOOKS_FILE.read_text())


def run_hook(hook: dict, cwd: Path) -> subprocess.CompletedProcess:
    words = shlex.split(hook["entry"]) + list(hook.get("args", []))
    assert words[0] == "symgrad" and hook["pass_filenames"] is False
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "symgrad", *words[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: one function declared in pyproject.toml, generated into generated/."""
    (tmp_path / "generated").mkdir()
    shutil.copy(ROOT / "generated" / "exp.py", tmp_path / "generated" / "exp.py")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.symgrad]\nout = "generated"\n\n[[tool.symgrad.functions]]\nname = "Exp"\nexpr = "exp(x)"\n'
    )
    return tmp_path


def test_the_hooks_are_declared():
    assert set(HOOKS) == {"symgrad-check", "symgrad-build-check"}
    for hook in HOOKS.values():
        assert hook["language"] == "python" and hook["name"] and hook["description"]


@pytest.mark.parametrize("hook_id", sorted(HOOKS))
def test_hook_passes_a_clean_module_and_fails_a_hand_edited_one(project, hook_id):
    hook = HOOKS[hook_id]
    clean = run_hook(hook, project)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    module = project / "generated" / "exp.py"
    module.write_text(module.read_text().replace("return grad_output * result", "return grad_output * result * 2"))
    edited = run_hook(hook, project)
    assert edited.returncode == 1, edited.stdout + edited.stderr
    assert "generated/exp.py was edited by hand" in edited.stdout


def test_check_takes_several_folders(project):
    other = project / "more"
    shutil.copytree(project / "generated", other)
    (other / "exp.py").write_text((other / "exp.py").read_text() + "# edited\n")
    result = run_hook({"entry": "symgrad check", "args": ["generated", "more"], "pass_filenames": False}, project)
    assert result.returncode == 1
    assert "1 file up to date" in result.stdout and "more/exp.py was edited by hand" in result.stdout
