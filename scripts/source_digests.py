"""Print the md5 of every source symgrad generates for the project's own specs.

A refactor proves itself by leaving these unchanged:

    python scripts/source_digests.py > before.txt   # on the old commit
    python scripts/source_digests.py > after.txt    # on the new one
    diff before.txt after.txt

It covers generated/ (every [tool.symgrad] function, rebuilt from its recorded spec), the
benchmark's bodies (benchmarks/bench.py, all four variants) and the stability cases
(tests/test_stability.py, both save modes, and fused where the tests fuse them).
``--jobs N`` spreads the work over N processes (deterministic output either way).
``--fast`` generates every source with the --fast buffer-reuse pass (in-place ops and
addcmul), which the default specs do not use: a refactor of that pass proves itself there.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def _jobs() -> list[tuple[str, dict]]:
    import bench
    import test_stability

    jobs = []
    for path in sorted((ROOT / "generated").glob("*.py")):
        if path.name == "__init__.py":
            continue
        jobs.append((f"generated/{path.name}", {"file": str(path)}))
    for name, expr, inputs, domain in bench.EXPRESSIONS:
        for suffix, fuse, save in (("", False, "memory"), ("Speed", False, "speed"), ("Fused", True, "memory"), ("FusedSpeed", True, "speed")):
            jobs.append((f"bench/{name}{suffix}", dict(expr=expr, name=name + suffix, inputs=inputs, domain=domain, fuse=fuse, save=save)))
    fused = {c.name for c in test_stability.FUSED_CASES}
    for case in test_stability.CASES:
        inputs = list(case.inputs) if len(case.inputs) > 1 else None
        for save in ("memory", "speed"):
            for fuse in (False, True) if case.name in fused else (False,):
                key = case.name + ("" if save == "memory" else f"_{save}") + ("_fused" if fuse else "")
                jobs.append((f"stability/{key}", dict(expr=case.expr, name="Stable_" + key, inputs=inputs, domain=case.domain or None, fuse=fuse, save=save)))
    return jobs


def _digest(job: tuple[str, dict], fast: bool = False) -> str:
    label, args = job
    import dataclasses

    import symgrad
    from symgrad.api import source_for_spec
    from symgrad.codegen.write import read_spec

    try:
        if "file" in args:
            path = Path(args["file"])
            spec = read_spec(path.read_text())
            source = source_for_spec(dataclasses.replace(spec, fast=True) if fast else spec, base_dir=path.parent)
        else:
            source = symgrad.generate_source(args.pop("expr"), args.pop("name"), **{**args, **({"fast": True} if fast else {})})
    except Exception as error:  # a refusal is part of the output too
        return f"{label} ERROR {type(error).__name__}: {error}"
    return f"{label} {hashlib.md5(source.encode()).hexdigest()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", default="", help="a label prefix, e.g. generated/")
    parser.add_argument("--fast", action="store_true", help="generate every source with --fast")
    args = parser.parse_args()
    jobs = [j for j in _jobs() if j[0].startswith(args.only)]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            lines = list(pool.map(_digest, jobs, [args.fast] * len(jobs), chunksize=4))
    else:
        lines = [_digest(j, args.fast) for j in jobs]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
