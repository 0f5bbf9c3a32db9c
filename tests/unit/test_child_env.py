"""Child processes of the tests, and of the GPU check's scripts (benchmarks/gpu_check_parts.py,
gpu_check_async.py, which the dry-run test runs), import the rloo their parent imported
(tests/helpers/child_env.py), so a mutant that benchmarks/mutation_check.py puts in a copy of src/
cannot escape a test through a child that imports the checkout's unmutated src/."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import rloo
from helpers.child_env import child_env

TESTS = Path(__file__).resolve().parents[1]
BENCHMARKS = TESTS.parent / "benchmarks"
HELPER = TESTS / "helpers" / "child_env.py"
MUTATION = BENCHMARKS / "mutation_check.py"  # the one that puts the mutated copy first, by design
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


def _sets_pythonpath(node: ast.AST) -> bool:
    """Code (not text: a docstring's shell line is not a child) that gives PYTHONPATH a value: a dict
    key, a keyword argument, or an item assigned."""
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "PYTHONPATH" for k in node.keys)
    if isinstance(node, ast.keyword):
        return node.arg == "PYTHONPATH"
    if isinstance(node, ast.Assign):
        subs = [t.slice for t in node.targets if isinstance(t, ast.Subscript)]
        return any(isinstance(s, ast.Constant) and s.value == "PYTHONPATH" for s in subs)
    return False


def test_no_benchmark_sets_pythonpath_but_through_the_helper():
    """The GPU check's children once got the checkout's src/ ahead of the inherited PYTHONPATH: under the
    mutation run they imported the unmutated source (fails on that code: gpu_check_parts.py's
    train_resume and gpu_check_async.py's cli)."""
    setters = [
        f"{p.relative_to(BENCHMARKS)}:{node.lineno}"
        for p in sorted(BENCHMARKS.rglob("*.py"))
        if p != MUTATION
        for node in ast.walk(ast.parse(p.read_text()))
        if _sets_pythonpath(node)
    ]
    assert not setters, f"use helpers.child_env.child_env for a child's PYTHONPATH: {setters}"
    name = "PYTHONPATH"  # not as a literal key: the text check over tests/ above would flag the line
    assert all(_sets_pythonpath(n) for n in (ast.keyword(arg=name), ast.parse(f"{{'{name}': p}}").body[0].value))


def test_the_gpu_checks_children_import_the_rloo_the_script_imported(tmp_path, monkeypatch):
    """gpu_check_async.cli and gpu_check_parts.train_resume start `python -m rloo.cli` with the folder
    of the rloo the script imported first on PYTHONPATH, wherever that is (here a stand-in location:
    a mutant's copy of src/ in the mutation run), then the inherited entries."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # undone after the test, with what the scripts add
    import gpu_check_async
    import gpu_check_parts

    copy = tmp_path / "copy" / "src"
    monkeypatch.setattr(rloo, "__path__", [str(copy / "rloo")])
    monkeypatch.setenv("PYTHONPATH", "inherited")
    envs = []

    def run(cmd, **kw):
        assert cmd[1:3] == ["-m", "rloo.cli"]
        envs.append(kw["env"])
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(gpu_check_parts, "tiny_policy", lambda assets: assets / "tiny_policy")
    gpu_check_async.cli(["--help"], tmp_path)
    gpu_check_parts.train_resume("cpu", True, tmp_path)
    assert len(envs) == 3  # cli's, train_resume's first run and its resume
    paths = [e["PYTHONPATH"] for e in envs]
    assert all(p.split(os.pathsep) == [str(copy), "inherited"] for p in paths), paths
    assert envs[0]["OMP_NUM_THREADS"] == str(gpu_check_async.threads())


def test_the_gpu_check_imports_the_rloo_pythonpath_names(tmp_path, monkeypatch):
    """benchmarks/gpu_check.py itself (its bench runs in its process) imports the rloo that PYTHONPATH
    names (the mutated copy in the mutation run), as gpu_check_parts.py decides; it put the checkout's
    src/ first (fails on that code: the stand-in is never imported and the part runs)."""
    fake = tmp_path / "copy" / "rloo"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise SystemExit('the stand-in rloo was imported')\n")
    monkeypatch.setattr(rloo, "__path__", [str(fake)])  # child_env puts the stand-in first
    env = child_env(inherit_pythonpath=False)
    cmd = [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--dry-run", "--parts", "update_fraction"]
    out = subprocess.run(
        [*cmd, "--out", str(tmp_path / "o.json")], env=env, capture_output=True, text=True, timeout=300
    )
    assert "the stand-in rloo was imported" in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
