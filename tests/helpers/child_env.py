"""The environment of a child Python process (`python -m rloo.cli`, torchrun, a script) that must import
the same rloo as the test process that starts it.

Why not the repository's own `src/` (computed from a test file's location): benchmarks/mutation_check.py
runs a test on a mutated COPY of src/ put first on PYTHONPATH; a child pointed at the checkout's src/
would import the unmutated source, and the mutant would escape every check the child makes."""

from __future__ import annotations

import os
from pathlib import Path

import rloo


def rloo_source() -> str:
    """The folder holding the `rloo` package this process imported (src/ of a checkout, or a copy)."""
    return str(Path(rloo.__path__[0]).parent)


def child_env(*paths: str | Path, inherit_pythonpath: bool = True, **overrides: str) -> dict[str, str]:
    """os.environ with PYTHONPATH = [this process's rloo source, *paths, the inherited PYTHONPATH], then
    `overrides`. inherit_pythonpath=False leaves the inherited PYTHONPATH out (a test that checks what
    a child finds without the user's entries on it)."""
    inherited = os.environ.get("PYTHONPATH", "") if inherit_pythonpath else ""
    entries = [rloo_source(), *map(str, paths), *([inherited] if inherited else [])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entries), **overrides}
