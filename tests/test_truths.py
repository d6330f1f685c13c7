"""The stored truths (tests/data/truths.json) are complete, current and right.

A stale store fails here, naming the cases to regenerate, before any stability test can
read an old number; and a seeded sample of the stored numbers is recomputed with mpmath.
"""

from __future__ import annotations

import os
import random

import mpmath
import pytest

from test_stability import exact_truth, stored_cases, stored_points
from truths import REGENERATE, STORE_PATH, TruthStore, from_text, parse_point, point_key

STORE = TruthStore.load()
# The sample recomputed on every run; SYMGRAD_TRUTH_SEED draws another (CI may rotate it).
SAMPLE_SEED = int(os.environ.get("SYMGRAD_TRUTH_SEED", "0"))
SAMPLE_SIZE = 40
# exact_truth stops once two precisions agree to 25 digits; the store keeps 32.
AGREEMENT = mpmath.mpf(10) ** -25


def _agrees(stored: list[str], value, grads) -> bool:
    return all(
        abs(from_text(text) - exact) <= AGREEMENT * abs(exact) for text, exact in zip(stored, [value, *grads], strict=True)
    )


def test_store_holds_exactly_the_stored_cases():
    missing = sorted(set(stored_cases()) - set(STORE.cases))
    extra = sorted(set(STORE.cases) - set(stored_cases()))
    assert not missing and not extra, f"stale truths (missing {missing}, no longer cases {extra}): run `{REGENERATE}`"


def test_every_case_is_stored_for_its_expression_at_exactly_its_points():
    stale = []
    for name, case in sorted(stored_cases().items()):
        entry = STORE.cases.get(name)
        if entry is None:
            continue  # (test_store_holds_exactly_the_stored_cases names it)
        wanted = {point_key(point) for point in stored_points(case)}
        if entry["expr"] != case.expr or set(entry["points"]) != wanted:
            stale.append(name)
        elif any(len(row) != 2 + len(case.inputs) for row in entry["points"].values()):
            stale.append(name)  # (a value and one gradient per input, after the digits)
    assert not stale, f"stale truths for {stale}: run `{REGENERATE} --only {' '.join(stale)}`"


@pytest.mark.parametrize("name", sorted(stored_cases()))
def test_case_truth_recomputes_at_its_cheapest_point(name):
    """Each case's formula still gives what is stored (a changed ``exact`` with the same
    expression text is caught here), at the point that converged at the fewest digits."""
    case = stored_cases()[name]
    entry = STORE.cases.get(name)
    if not entry:
        pytest.fail(f"no stored truths for {name!r}: run `{REGENERATE}`")
    key, (_, *numbers) = min(sorted(entry["points"].items()), key=lambda item: item[1][0])
    point = parse_point(key)
    value, grads, _ = exact_truth(case.exact, point)
    assert _agrees(numbers, value, grads), f"{name} at {point}: stored {numbers}, mpmath {value}, {grads}"


def test_seeded_sample_of_stored_truths_recomputes():
    rows = list(STORE.rows())
    assert rows, f"no stored truths: run `{REGENERATE}`"
    sample = random.Random(SAMPLE_SEED).sample(rows, min(SAMPLE_SIZE, len(rows)))
    wrong = []
    for name, point, _, numbers in sample:
        value, grads, _ = exact_truth(stored_cases()[name].exact, point)
        if not _agrees(numbers, value, grads):
            wrong.append((name, point, numbers, str(value), [str(g) for g in grads]))
    assert not wrong, f"stored truths differ from mpmath (seed {SAMPLE_SEED}): {wrong}"


def test_store_is_written_deterministically(tmp_path):
    """Regenerating byte for byte: what the store reads back writes the same file."""
    copy = tmp_path / "truths.json"
    TruthStore.write(STORE.cases, copy)
    assert copy.read_bytes() == STORE_PATH.read_bytes()
