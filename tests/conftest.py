"""Shared fixtures: discovery of the modules in generated/ and their sample inputs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

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
