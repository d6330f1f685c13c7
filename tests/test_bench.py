"""The benchmark still runs: a smoke test at a tiny size (no timing is asserted).

The numbers in the README come from benchmarks/bench.py, so a change that breaks it
(a renamed option, a template change the modules it generates no longer import with)
should fail here, not when someone next wants numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def test_benchmark_runs_and_reports_every_variant():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "1e3", "--only", "Double", "Mish", "--repeats", "1", "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "ERROR" not in out and "generation failed" not in out, out
    assert "| Double | 1e+03 |" in out and "| Mish | 1e+03 |" in out, out
    for line in ("default/eager time", "fused/compile time", "default/eager kernels", "default/eager saved bytes"):
        assert line in out, line
