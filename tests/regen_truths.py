"""Recompute tests/data/truths.json: every stored stability case at every point its tests use.

    python tests/regen_truths.py [--jobs N] [--only NAME ...]

Run it after adding or changing a case in tests/test_stability.py (CASES or
_TAIL_VALUE_CASES), its points, or FLOAT16_OVERFLOWS; the default tier fails until then.
``--only`` recomputes the named cases and keeps the others as stored. The output is
deterministic: the same cases give the same bytes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for folder in (TESTS.parent, TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import test_stability  # noqa: E402
from truths import STORE_PATH, TruthStore, point_key, to_text  # noqa: E402


def _evaluate(task: tuple[str, tuple[float, ...]]) -> tuple[str, str, list]:
    name, point = task
    value, grads, dps = test_stability.exact_truth(test_stability.stored_cases()[name].exact, point)
    return name, point_key(point), [dps, to_text(value), *(to_text(g) for g in grads)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="recompute only these cases")
    args = parser.parse_args(argv)

    cases = test_stability.stored_cases()
    unknown = sorted(set(args.only or ()) - set(cases))
    if unknown:
        parser.error(f"no stored case named {', '.join(unknown)}")
    names = sorted(args.only or cases)
    kept = {name: entry for name, entry in TruthStore.load().cases.items() if args.only and name in cases and name not in names}
    fresh = {name: {"expr": cases[name].expr, "points": {}} for name in names}
    tasks = [(name, point) for name in names for point in test_stability.stored_points(cases[name])]
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, (name, key, row) in enumerate(pool.imap_unordered(_evaluate, tasks, chunksize=4), 1):
            fresh[name]["points"][key] = row
            if done % 500 == 0:
                print(f"{done}/{len(tasks)} points, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    TruthStore.write({**kept, **fresh})
    print(f"wrote {STORE_PATH} ({len(kept) + len(fresh)} cases, {len(tasks)} points recomputed"
          f" in {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
