"""benchmarks/mutation_check.py's mutants still apply to today's source, without running them: each
original text occurs exactly once in its file under src/rloo (and its replacement changes the file),
each test it names exists, and docs/reliability.md's mutation table lists the same behaviours, files
and tests in the same order. A refactor that moves the code a mutant edits fails here, in the quick
suite, instead of the mutant going stale unnoticed until someone runs the minutes-long check."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "rloo"
RELIABILITY = ROOT / "docs" / "reliability.md"
HEADER = "| behaviour removed | file | test | result | s |"


def _script():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "benchmarks" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _script()


@pytest.mark.parametrize("name", list(CHECK.MUTANTS))
def test_mutant_matches_its_file_exactly_once(name):
    m = CHECK.MUTANTS[name]
    path = SRC / m.file
    assert path.is_file(), f"{name}: src/rloo/{m.file} does not exist"
    text = path.read_text()
    try:
        mutated = CHECK.apply_edits(text, m.old, m.new)
    except CHECK.StaleMutant as e:
        pytest.fail(f"{name} is stale in src/rloo/{m.file}: {e}")
    assert mutated != text, f"{name}: the replacement leaves src/rloo/{m.file} as it was"


@pytest.mark.parametrize("name", list(CHECK.MUTANTS))
def test_mutant_names_an_existing_test(name):
    file, _, inner = CHECK.MUTANTS[name].test.partition("::")
    assert (ROOT / file).is_file(), f"{name}: {file} does not exist"
    if inner:  # a function, maybe in a class (Class::test), maybe with a parameter id (test[...])
        func = inner.split("::")[-1].split("[")[0]
        assert re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(", (ROOT / file).read_text(), re.M), (
            f"{name}: no test {func} in {file}"
        )


def _doc_rows() -> list[tuple[str, str, str]]:
    """(behaviour, file, test) of each row of docs/reliability.md's mutation table."""
    lines = RELIABILITY.read_text().splitlines()
    start = lines.index(HEADER) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(tuple(cell.strip() for cell in line.strip("|").split("|")[:3]))
    return rows


def test_reliability_table_lists_the_mutants_in_order():
    expected = [(m.behaviour, m.file, CHECK.test_column(m)) for m in CHECK.MUTANTS.values()]
    assert _doc_rows() == expected


# docs/testing.md's per-layer sample was applied by hand (no script records its edits), so only
# what its table names can be checked: the test files it ran and the tests it says caught each bug.
ARCHITECTURE = ROOT / "docs" / "testing.md"
LAYER_HEADER = "| layer | bug | quick-suite files run | caught by |"


def _layer_rows() -> list[tuple[str, list[Path], list[str]]]:
    """(layer, test files run, names of the catching tests) of each row of the per-layer sample; a
    file named without its folder is in the folder of the one before it."""
    lines = ARCHITECTURE.read_text().splitlines()
    rows, start = [], lines.index(LAYER_HEADER) + 2
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        layer, _, files, caught = (cell.strip() for cell in line.strip("|").split("|"))
        paths, folder = [], ""
        for f in (f.strip() for f in files.split(",")):
            folder, name = f.rsplit("/", 1) if "/" in f else (folder, f)
            paths.append(ROOT / "tests" / folder / name)
        rows.append((layer, paths, [n.split("[")[0] for n in re.findall(r"`([^`]+)`", caught)]))
    return rows


def test_layer_sample_names_existing_tests():
    rows = _layer_rows()
    assert rows, "the per-layer mutation table was not found in docs/testing.md"
    for layer, paths, tests in rows:
        for path in paths:
            assert path.is_file(), f"{layer}: {path.relative_to(ROOT)} does not exist"
        text = "".join(p.read_text() for p in paths)
        for name in tests:
            assert re.search(rf"^\s*def {re.escape(name)}\(", text, re.M), f"{layer}: no test {name} in its files"
