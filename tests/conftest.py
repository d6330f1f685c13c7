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


# -- Test tiers (tests/README.md) ----------------------------------------------------------
#
# pyproject's addopts deselect the `slow` and `exhaustive` markers; `pytest -m ""` runs all.
# A test parametrized over the axes below runs its whole product only in the slow tier: the
# default tier keeps, for each combination of its other parameters (each case, each module),
# the fewest axis combinations that still take every axis value once, rotated from one case
# to the next so that the pairings differ between cases.
VARIANT_AXES = ("dtype", "save", "fuse")


def pytest_collection_modifyitems(config, items):
    groups: dict[tuple, list] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not any(axis in params for axis in VARIANT_AXES):
            continue
        others = tuple(sorted((name, _identity(value)) for name, value in params.items() if name not in VARIANT_AXES))
        groups.setdefault((item.module.__name__, item.originalname, others), []).append(item)
    rotation: dict[tuple, int] = {}
    for (module, function, _), members in groups.items():
        offset = rotation.setdefault((module, function), 0)
        rotation[(module, function)] += 1
        variants = [_variant(item) for item in members]
        kept = _covering_variants(variants, offset)
        for item, variant in zip(members, variants):
            if variant not in kept:
                item.add_marker(pytest.mark.slow)


def _identity(value) -> object:
    try:
        hash(value)
    except TypeError:
        return id(value)  # (a case object: the same object throughout the parametrize list)
    return value


def _variant(item) -> tuple:
    params = item.callspec.params
    return tuple((axis, params[axis]) for axis in VARIANT_AXES if axis in params)


def _covering_variants(variants: list[tuple], offset: int) -> set[tuple]:
    """A few of ``variants`` that together take every value of every axis: greedily the one
    taking the most values not yet taken, ties going to the first after ``offset``."""
    order = variants[offset % len(variants) :] + variants[: offset % len(variants)]
    untaken = {value for variant in variants for value in variant}
    kept: set[tuple] = set()
    while untaken:
        best = max(order, key=lambda variant: len(untaken.intersection(variant)))
        kept.add(best)
        untaken -= set(best)
    return kept
