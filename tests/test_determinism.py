"""Determinism (issue 3): the same spec gives byte-identical output across processes and
``PYTHONHASHSEED`` values, so `symgrad check` means the same on every machine.

Hash randomisation reorders sets and dicts of SymPy symbols and strings; any output that
follows such an order would differ between the processes below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from symgrad.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ["0", "1", "12345", "random"]

# Multi-output, params, Piecewise, Max, surrogate gradients, in-place, domain, reductions.
CONFIG = """\
[tool.symgrad]
out = "ops"

[[tool.symgrad.functions]]
name = "Pair"
expr = "x*y, x+y, sin(x)*exp(y)"
inputs = ["y", "x"]

[[tool.symgrad.functions]]
name = "Blend"
expr = "alpha*x*y + log(1 + y**2)*exp(-x) + beta*z"
params = ["beta", "alpha"]
domain = { z = [-1, 1], x = [0.1, 4] }

[[tool.symgrad.functions]]
name = "Ramp"
expr = "Piecewise((x**2*w, x > 0), (w*sin(x), True))"

[[tool.symgrad.functions]]
name = "Hinge"
expr = "Max(x - y, 0)*z + Min(x, z)"

[[tool.symgrad.functions]]
name = "SignSTE"
expr = "sign(x)*a + b"
grad = { x = "Piecewise((1, abs(x) <= 1), (0, True))" }
params = ["a", "b"]

[[tool.symgrad.functions]]
name = "Tanh_"
expr = "tanh(x)"
inplace = true

[[tool.symgrad.functions]]
name = "Loss"
expr = "mean((x - y)**2 + abs(x)*y)"
"""

# One module also through the plain `symgrad EXPR --name NAME` path.
COMMAND = ["c*b*a + exp(a*b) + log(1 + c**2), a - c", "--name", "Triple", "--params", "c", "--stdout"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


def test_output_is_identical_under_every_hash_seed(tmp_path):
    processes = {}
    for seed in SEEDS:
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        (folder / "pyproject.toml").write_text(CONFIG)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
        # Started together, waited for together: the CPUs are shared, the wall time is not.
        processes[seed] = [
            subprocess.Popen(
                [sys.executable, "-m", "symgrad", *args],
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for args in (["build"], COMMAND)
        ]
    outputs = {}
    for seed, (build, command) in processes.items():
        build_out, build_err = build.communicate(timeout=300)
        command_out, command_err = command.communicate(timeout=300)
        assert build.returncode == 0, build_out + build_err
        assert command.returncode == 0, command_err
        files = snapshot(tmp_path / f"seed-{seed}")
        assert len(files) == 7 + 1  # the modules and ops/__init__.py
        outputs[seed] = (files, command_out)

    reference = outputs[SEEDS[0]]
    for seed in SEEDS[1:]:
        assert outputs[seed][1] == reference[1], f"`symgrad {COMMAND[0]}` differs under PYTHONHASHSEED={seed}"
        for name, text in reference[0].items():
            assert outputs[seed][0][name] == text, f"{name} differs under PYTHONHASHSEED={seed}"

    # And this process (its own hash seed, with caches already warm) agrees, via regen.
    here = tmp_path / f"seed-{SEEDS[0]}" / "ops"
    assert main(["check", str(here)]) == 0
