"""Every relative link in README.md and docs/ points at a file that exists (and, with a #fragment into
a markdown file, at one of its headings), and every repository path named in backticks exists. Files
move (docs/results/, tests/integration/); a moved file leaves dangling links that nothing else notices."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")


def _top_level() -> set[str]:
    """The repository's tracked top-level folders: a backticked word starting with one of them is a path."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = {line.split("/", 1)[0] for line in out.splitlines() if "/" in line}
    except (OSError, subprocess.CalledProcessError):  # an unpacked sdist: the folders that are there
        names = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".git")}
    return names


TOP = _top_level()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped except '-' and '_', spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = FENCE.sub("", md.read_text())
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)}


def _links(md: Path) -> list[str]:
    text = FENCE.sub("", md.read_text())
    text = INLINE_CODE.sub("", text)  # `[x](y)` in code is not a link
    return [a or b for a, b in LINK.findall(text)]


def _backticked_paths(md: Path) -> list[str]:
    """Repository paths in inline code: words that start with a tracked top-level folder (tests/...,
    benchmarks/..., .ci/...), or with rloo/ (a module path under src/)."""
    text = FENCE.sub("", md.read_text())
    found = []
    for span in INLINE_CODE.findall(text):
        for word in span.split():
            word = word.split("::", 1)[0].rstrip(".,;:)")
            head = word.split("/", 1)[0]
            if "/" in word and (head in TOP or head == "rloo"):
                found.append(word)
    return found


def _exists(path: str) -> bool:
    base = ROOT / "src" if path.startswith("rloo/") else ROOT
    if any(c in path for c in "*?["):
        return any(base.glob(path))
    return (base / path).exists()


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    broken = []
    for target in _links(md):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{md.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_repository_paths_exist(md):
    missing = [p for p in _backticked_paths(md) if not _exists(p)]
    assert not missing, f"{md.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_checks_see_what_they_check():
    """The parsers find links, anchors and paths at all (a regex that matched nothing would pass)."""
    readme = ROOT / "README.md"
    assert any(not re.match(r"^[a-z]+:", t) for t in _links(readme))
    assert _backticked_paths(readme)
    assert _slug("What bounds M's decode loop") == "what-bounds-ms-decode-loop"
    assert _slug("Sampling and `top_p`") == "sampling-and-top_p"
    assert not _exists("tests/test_own_data.py") and _exists("tests/integration/test_own_data.py")


def test_raw_results_live_under_docs_results():
    """docs/ holds guides (markdown); raw results (JSON, plots, reports) go to docs/results/<study>/,
    each folder with a README naming the command and commit that made it."""
    loose = [p.name for p in (ROOT / "docs").iterdir() if p.is_file() and p.suffix != ".md"]
    assert not loose, f"move these into docs/results/<study>/: {loose}"
    studies = [p for p in (ROOT / "docs" / "results").iterdir() if p.is_dir()]
    assert studies and all((p / "README.md").exists() for p in studies), [p.name for p in studies]
    index = (ROOT / "docs" / "results" / "index.md").read_text()
    assert all(f"]({p.name}/README.md)" in index for p in studies), "docs/results/index.md lists every study"
    # a study's scripts go to benchmarks/studies/, where lint and pyright see them
    scripts = [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "results").rglob("*.py")]
    assert not scripts, f"move these to benchmarks/studies/: {scripts}"
