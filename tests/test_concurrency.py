"""Concurrent writers: several symgrad processes writing one output folder at once never
leave a corrupt or half-written file, and readers only ever see complete files.

Writers race on the same file (with different contents, so every round really replaces
it) and on their own files, for many rounds; a reader process checks every file it can
see while they run. Afterwards every file is complete, passes the header hash check
(``is_hand_edited``), is exactly one of the texts symgrad generates, and imports.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from symgrad.api import build_spec, source_for_spec
from symgrad.codegen.write import is_hand_edited, read_spec
from symgrad.plan.docs import metadata_of

ROUNDS = 150
WRITERS = 3
PROCESS_TIMEOUT_S = 300  # a hang detector only
EXPRESSIONS = ("x**2", "sin(x)*x", "exp(-x)*x + 1")

# A writer: generates its texts once, then writes them round after round through the same
# path generate_file uses (ensure_package + write_if_changed, i.e. atomic replace).
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from symgrad.api import build_spec, output_path, source_for_spec
    from symgrad.codegen.write import ensure_package, write_if_changed

    out, me, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    exprs = {exprs!r}
    shared = [build_spec(e, "Shared") for e in exprs]
    own = [build_spec(e, f"Own{{me}}") for e in exprs]
    texts = {{id(s): source_for_spec(s) for s in shared + own}}
    for i in range(rounds):
        for spec in (shared[(i + me) % len(shared)], own[i % len(own)]):
            ensure_package(out)
            write_if_changed(output_path(spec, out), texts[id(spec)])
    print("done")
    """
).format(exprs=EXPRESSIONS)

# A reader: while the writers run, every file it reads must be complete and unedited.
READER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from symgrad.codegen.write import is_hand_edited

    out, stop = Path(sys.argv[1]), Path(sys.argv[2])
    reads = bad = 0
    while not stop.exists():
        for path in sorted(out.glob("*.py")) if out.exists() else []:
            if path.name == "__init__.py":
                continue
            text = path.read_text(encoding="utf-8")
            reads += 1
            if is_hand_edited(text) or not text.endswith("\\n"):
                bad += 1
                print("BAD", path, len(text))
        time.sleep(0.001)
    print("reads", reads, "bad", bad)
    """
)


def _expected_texts() -> dict[str, set[str]]:
    expected: dict[str, set[str]] = {}
    names = ["Shared"] + [f"Own{k}" for k in range(WRITERS)]
    for name in names:
        stem = "shared" if name == "Shared" else f"own{name[3:]}"
        expected[stem] = {source_for_spec(build_spec(e, name)) for e in EXPRESSIONS}
    return expected


def _import(path: Path):
    name = f"concurrent_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _wait(process: subprocess.Popen) -> tuple[str, str]:
    try:
        return process.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"a concurrent symgrad process hung (no exit after {PROCESS_TIMEOUT_S} s)")


def _check_folder(out: Path, expected: dict[str, set[str]]) -> None:
    files = sorted(p.name for p in out.iterdir())
    assert not [f for f in files if f.endswith(".tmp")], f"temporary files left behind: {files}"
    assert (out / "__init__.py").is_file()
    for path in sorted(out.glob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert not is_hand_edited(text), f"{path.name} fails its header hash check"
        assert read_spec(text) is not None
        if path.stem in expected:
            assert text in expected[path.stem], f"{path.name} is not a text symgrad generates"
        module = _import(path)
        assert metadata_of(module)["function"] in text


def test_concurrent_writers_never_leave_a_broken_file(tmp_path):
    out = tmp_path / "out"
    stop = tmp_path / "stop"
    writer, reader = tmp_path / "writer.py", tmp_path / "reader.py"
    writer.write_text(WRITER, encoding="utf-8")
    reader.write_text(READER, encoding="utf-8")
    watching = subprocess.Popen(
        [sys.executable, str(reader), str(out), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    writers = [
        subprocess.Popen(
            [sys.executable, str(writer), str(out), str(k), str(ROUNDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(WRITERS)
    ]
    results = [_wait(p) for p in writers]
    stop.touch()
    seen, errors = _wait(watching)
    for process, (stdout, stderr) in zip(writers, results):
        assert process.returncode == 0, stderr
        assert stdout.strip() == "done"
    assert watching.returncode == 0, errors
    assert "BAD" not in seen, seen
    assert "bad 0" in seen, seen
    reads = int(seen.split("reads ")[1].split()[0])
    assert reads > 0, "the reader saw no file while the writers ran"
    _check_folder(out, _expected_texts())


def test_concurrent_cli_runs(tmp_path):
    """Real `symgrad` processes: the same file and different files, several rounds at once."""
    out = tmp_path / "out"
    rounds = 3
    for round_ in range(rounds):
        commands = [
            [sys.executable, "-m", "symgrad", EXPRESSIONS[(round_ + k) % len(EXPRESSIONS)], "--name", "Shared",
             "--out", str(out)]
            for k in range(2)
        ] + [
            [sys.executable, "-m", "symgrad", EXPRESSIONS[round_ % len(EXPRESSIONS)], "--name", f"Own{k}",
             "--out", str(out)]
            for k in range(2)
        ]  # fmt: skip
        processes = [
            subprocess.Popen(c, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in commands
        ]
        for process in processes:
            stdout, stderr = _wait(process)
            assert process.returncode == 0, stderr
            assert stdout.strip().endswith(".py")
    expected = {
        "shared": {source_for_spec(build_spec(e, "Shared")) for e in EXPRESSIONS},
        **{f"own{k}": {source_for_spec(build_spec(e, f"Own{k}")) for e in EXPRESSIONS} for k in range(2)},
    }
    _check_folder(out, expected)
    assert json.loads(json.dumps(sorted(p.name for p in out.glob("*.py")))) == [
        "__init__.py",
        "own0.py",
        "own1.py",
        "shared.py",
    ]
