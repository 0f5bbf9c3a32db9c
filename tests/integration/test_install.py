"""`pip install -e .` beside the user's own torch: the package states the oldest torch it supports
instead of pinning one, so pip keeps an installed (e.g. CUDA) torch that meets it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fake_torch_wheel(folder: Path, version: str) -> Path:
    """A wheel that only claims to be torch `version` (metadata and an empty module): pip's resolver
    sees an installed torch without a multi-GB download."""
    name = f"torch-{version}"
    whl = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("torch/__init__.py", f"__version__ = {version!r}\n")
        z.writestr(f"{name}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(
            f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{name}.dist-info/RECORD", "")
    return whl


@pytest.mark.slow
@pytest.mark.parametrize("installed", ["2.9.0", "2.11.0"])
def test_pip_install_keeps_an_installed_supported_torch(tmp_path, installed):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", "--no-deps", str(_fake_torch_wheel(tmp_path, installed))], check=True)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [*pip, "install", "--dry-run", "--report", str(report), "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    would_install = {
        i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    assert "rloo" in would_install and "transformers" in would_install
    assert "torch" not in would_install, f"pip would replace torch {installed} by {would_install['torch']}"


def test_torch_requirement_is_a_floor_not_a_pin():
    """The declared requirement admits every torch from the oldest supported one on (fast check of
    what the slow test above shows with pip itself)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    (torch_req,) = [r for r in deps if r.name == "torch"]
    assert not torch_req.specifier.contains("2.8.0")
    assert all(torch_req.specifier.contains(v) for v in ("2.9.0", "2.11.0", "2.13.0", "2.15.0"))


def _floors() -> dict[str, str]:
    """{name: floor} of every direct requirement: the package's and its dev extra's (what `make test`
    installs)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(text)
        (floor,) = [s.version for s in req.specifier if s.operator == ">="]
        floors[canonicalize_name(req.name)] = floor
    return floors


def test_oldest_lock_pins_each_stated_floor():
    """`make test-oldest` runs the suite on .ci/oldest-requirements.txt. Each direct requirement is
    pinned there at exactly its stated floor, so every floor in pyproject.toml is a tested version.
    After changing a floor, `make oldest-lock` regenerates the file."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = {}
    for line in (ROOT / ".ci" / "oldest-requirements.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name.split("[")[0].strip())] = version.strip()
    stale = {
        name: (floor, pins.get(name))
        for name, floor in _floors().items()
        if name not in pins or Version(pins[name]) != Version(floor)
    }
    assert not stale, f"floor in pyproject.toml vs pin in .ci/oldest-requirements.txt (make oldest-lock): {stale}"
