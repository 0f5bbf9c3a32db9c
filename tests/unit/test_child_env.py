"""Child processes of the tests import the rloo the test imported (tests/helpers/child_env.py), so a
mutant that benchmarks/mutation_check.py puts in a copy of src/ cannot escape a test through a child
that imports the checkout's unmutated src/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import rloo
from helpers.child_env import child_env

TESTS = Path(__file__).resolve().parents[1]
HELPER = TESTS / "helpers" / "child_env.py"
# PYTHONPATH given a value: as a quoted dict key followed by a colon, or as a keyword argument
SETS_PYTHONPATH = re.compile(r"""["']PYTHONPATH["']\s*:|\bPYTHONPATH\s*=""")


def _child_rloo(env: dict[str, str]) -> Path:
    out = subprocess.run(
        [sys.executable, "-c", "import rloo; print(rloo.__file__)"], env=env, capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip()).resolve()


def test_a_child_imports_the_rloo_this_process_imported():
    want = Path(rloo.__file__).resolve()
    assert _child_rloo(child_env()) == want
    assert _child_rloo(child_env(TESTS, inherit_pythonpath=False)) == want


def test_no_test_sets_pythonpath_but_through_the_helper():
    setters = [
        f"{p.relative_to(TESTS)}:{n}"
        for p in sorted(TESTS.rglob("*.py"))
        if p != HELPER
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SETS_PYTHONPATH.search(line)
    ]
    assert not setters, f"use helpers.child_env.child_env for a child's PYTHONPATH: {setters}"
