"""Recompute tests/data/range_truths.json: every range-test target at every point.

    python tests/regen_range_truths.py [--jobs N] [--only KEY ...]

Run it after adding or changing a module in generated/'s specs, a stability case, or the
range test's points (tests/test_range.py); the range test fails until then. ``--only``
recomputes the named targets (``generated/blend``, ``stability/softplus``) and keeps the
others as stored. The output is deterministic: the same targets give the same bytes.
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

import test_range  # noqa: E402
import mpmath  # noqa: E402

from truths import TruthStore, point_key  # noqa: E402


def _targets() -> dict:
    return {target.key: target for target in test_range.all_targets()}


def _to_text(value: mpmath.mpf) -> str:
    return mpmath.nstr(value, test_range.RANGE_DIGITS, min_fixed=1, max_fixed=0)


def _evaluate(task: tuple[str, tuple[float, ...]]) -> tuple[str, str, list]:
    key, point = task
    digits, values = test_range.exact_quantities(_targets()[key], point)
    return key, point_key(point), [digits, *(None if v is None else _to_text(v) for v in values)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--only", nargs="+", metavar="KEY", help="recompute only these targets")
    args = parser.parse_args(argv)

    targets = _targets()
    unknown = sorted(set(args.only or ()) - set(targets))
    if unknown:
        parser.error(f"no range target named {', '.join(unknown)}")
    keys = sorted(args.only or targets)
    stored = TruthStore.load(test_range.RANGE_STORE_PATH).cases
    kept = {key: entry for key, entry in stored.items() if args.only and key in targets and key not in keys}
    fresh = {key: {"expr": targets[key].record, "points": {}} for key in keys}
    tasks = [(key, point) for key in keys for point in test_range.range_points(len(targets[key].inputs))]
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, (key, point, row) in enumerate(pool.imap_unordered(_evaluate, tasks, chunksize=8), 1):
            fresh[key]["points"][point] = row
            if done % 1000 == 0:
                print(f"{done}/{len(tasks)} points, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    TruthStore.write({**kept, **fresh}, test_range.RANGE_STORE_PATH)
    print(f"wrote {test_range.RANGE_STORE_PATH} ({len(kept) + len(fresh)} targets, {len(tasks)} points"
          f" in {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
