"""Shared fixtures: discovery of the modules in generated/ and their sample inputs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from symgrad.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for the device-aware tests (generated modules' contract, stability, fused,"
        " inductor kernels), e.g. cuda; default cpu",
    )


@pytest.fixture(scope="session")
def device(request):
    """The torch device of ``--device``. Generated code must run unchanged on any device, so
    the contract tests take their inputs here; asking for an absent device is an error, not a skip."""
    import torch

    name = request.config.getoption("--device")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {name}: torch sees no CUDA device")
    return device


def generated_names() -> list[str]:
    return sorted(p.stem for p in GENERATED.glob("*.py") if p.name != "__init__.py")


def load(name: str):
    return compiled_at_every_size(importlib.import_module(f"generated.{name}"))


def compiled_at_every_size(module):
    """Make a fused module compile its bodies for tensors of any size, as for large ones.

    The tests' tensors are small, which a fused module would otherwise run eagerly on a CPU
    (its ``_EAGER_WORK_LIMIT``); its contracts must hold for the compiled bodies too.
    tests/test_fused.py checks the small-tensor path itself. A default module is returned as it is.
    """
    if hasattr(module, "_EAGER_WORK_LIMIT"):
        module._EAGER_WORK_LIMIT = 0
    return module


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
