"""The installable wheel (issue 3): templates ship inside it, and the installed `symgrad`
works from any folder.

The wheel is built from a temporary copy of the source tree, so the repository gets no
build/ or *.egg-info. The virtual environment reuses this interpreter's packages
(through a .pth file) so that torch, sympy and black need no download; the wheel
itself is installed with ``--no-deps --no-index``, so nothing is fetched at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from symgrad import generate_source

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def source_copy(folder: Path) -> Path:
    """What a wheel is built from: the package, templates and metadata, nothing generated."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in ("symgrad", "templates"):
        shutil.copytree(ROOT / name, folder / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, folder / name)
    return folder


def build_leftovers() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if p.name in ("build", "dist") or p.name.endswith(".egg-info"))


def test_wheel_installs_and_runs_from_elsewhere(tmp_path):
    before = build_leftovers()
    source = source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    # --no-build-isolation: the setuptools already installed builds it, offline.
    pip_options = ["--no-deps", "--no-index", "--no-cache-dir", "--disable-pip-version-check"]
    run(sys.executable, "-m", "pip", "wheel", source, *pip_options, "--no-build-isolation", "-w", dist, cwd=tmp_path)
    (wheel,) = dist.glob("symgrad-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    templates = sorted(p.name for p in (ROOT / "templates").glob("*.jinja"))
    assert templates and all(f"symgrad/templates/{name}" in names for name in templates)
    packaged = ["symgrad/cli/main.py", "symgrad/codegen/render.py", "symgrad/runtime/helpers.py", "symgrad/py.typed"]
    assert all(name in names for name in packaged)
    assert not any(name.startswith(("templates/", "tests/", "generated/")) for name in names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    # The dependencies (torch, sympy, black, pip) come from the environment running this
    # test, which may itself be a venv (as in CI): --system-site-packages would reach the
    # base interpreter instead. A .pth adds its folders after the venv's own; .pth files
    # inside them are not processed, so an editable symgrad there stays invisible.
    venv_site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(venv_site.stdout.strip(), "outer_environment.pth").write_text("\n".join(sorted(ours)) + "\n")
    # pip installs into the venv; --force-reinstall because a symgrad of the same version
    # may be installed (editable) outside it.
    run(python, "-m", "pip", "install", *pip_options, "--force-reinstall", wheel, cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    located = run(
        python, "-c", "import symgrad.codegen.render as r; print(r.__file__); print(r.builtin_template_dir())", cwd=work
    )
    module_file, template_dir = located.stdout.splitlines()
    assert Path(module_file).resolve().is_relative_to(venv.resolve())
    assert Path(template_dir).resolve() == (Path(module_file).parent.parent / "templates").resolve()

    symgrad = bin_dir / ("symgrad.exe" if os.name == "nt" else "symgrad")
    assert (
        run(symgrad, "sqrt(x)+1/x", "--name", "SqrtInverse", cwd=work).stdout
        == f"{Path('generated', 'sqrt_inverse.py')}\n"
    )
    text = (work / "generated" / "sqrt_inverse.py").read_text()
    assert text == generate_source("sqrt(x)+1/x", "SqrtInverse")  # the same templates as the source tree
    assert run(symgrad, "check", cwd=work).stdout == "1 file up to date\n"
    imported = run(python, "-c", "from generated.sqrt_inverse import sqrt_inverse; print('ok')", cwd=work)
    assert imported.stdout == "ok\n"

    assert build_leftovers() == before  # no build/, dist/ or *.egg-info added to the repository
