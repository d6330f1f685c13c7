"""Shared fixtures: discovery of the modules in generated/ and their sample inputs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from symgrad.cli import main

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def generated_names() -> list[str]:
    return sorted(p.stem for p in GENERATED.glob("*.py") if p.name != "__init__.py")


def load(name: str):
    return importlib.import_module(f"generated.{name}")


@pytest.fixture(params=generated_names())
def module(request):
    """Each module in generated/, by file stem (black's data-driven cases, tangent's ids)."""
    return load(request.param)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run ``symgrad ARGS`` in ``tmp_path``; returns (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
