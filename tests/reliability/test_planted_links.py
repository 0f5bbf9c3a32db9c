"""A link planted in a run folder where one of rloo's own files should be (`metrics.jsonl`,
`summary.json`, a plot, ...) is never written or truncated through: the file it points to is left
as it was. Before, a resumed run cut `metrics.jsonl` back to its checkpoint with os.truncate,
which follows links, and then appended through it; summaries and plots were written in place."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.runtime.runfolder.atomic import WriteError, atomic_savefig, open_append, truncate_file

from .conftest import TRAIN

SRC = Path(__file__).resolve().parents[2] / "src" / "rloo"


def _victim(tmp_path: Path) -> tuple[Path, bytes]:
    victim = tmp_path / "thesis.tex"
    data = b"chapter one\n" * 2000  # longer than any checkpoint's metrics_bytes
    victim.write_bytes(data)
    return victim, data


def test_resume_never_truncates_or_appends_through_a_planted_metrics_link(train_run, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(train_run, out, symlinks=True)
    victim, data = _victim(tmp_path)
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(victim)
    steps = [a if not a.startswith("steps=") else "steps=3" for a in TRAIN]
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *steps, "--resume"])
    err = capsys.readouterr().err
    assert victim.read_bytes() == data, "the linked file was changed"
    errors = [line for line in err.splitlines() if "error" in line]
    assert rc == 2 and "Traceback" not in err and len(errors) == 1, err
    assert "metrics.jsonl: it is a link" in errors[0], errors[0]


def test_open_append_and_truncate_refuse_a_link(tmp_path):
    victim, data = _victim(tmp_path)
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(victim)
    with pytest.raises(WriteError, match=r"metrics\.jsonl: it is a link"):
        open_append(link)
    with pytest.raises(WriteError, match=r"metrics\.jsonl: it is a link"):
        truncate_file(link, 0)
    assert victim.read_bytes() == data
    plain = tmp_path / "plain.jsonl"
    with open_append(plain) as fh:
        fh.write("a\n")
    with open_append(plain) as fh:
        fh.write("b\n")
    truncate_file(plain, 2)
    assert plain.read_text() == "a\n"


def test_a_plot_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    victim, data = _victim(tmp_path)
    target = tmp_path / "reward.png"
    target.symlink_to(victim)
    fig = plt.figure()
    atomic_savefig(fig, target, dpi=20)
    plt.close(fig)
    assert victim.read_bytes() == data
    assert not target.is_symlink() and target.read_bytes().startswith(b"\x89PNG")
    assert not list(tmp_path.glob(".*.tmp"))


# Files a command writes inside a run folder go through rloo.runtime.runfolder.atomic (a temporary sibling and
# a rename, or an O_NOFOLLOW open); these write elsewhere, to a path the user chose or a fresh folder:
_ELSEWHERE = {
    "config/loading.py": "save_config writes where its caller says (a user's --config output)",
    "runtime/runfolder/atomic.py": "the safe writers themselves",
}


def test_run_folder_files_are_written_only_through_the_safe_writers():
    plain = re.compile(r"\.write_text\(|\.write_bytes\(|\.savefig\(|\.open\(\s*[\"'][aw]|\bopen\([^)]*,\s*[\"'][aw]")
    found = []
    for f in sorted(SRC.rglob("*.py")):
        rel = str(f.relative_to(SRC))
        if rel in _ELSEWHERE:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if plain.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "written in place (a planted link would be followed):\n" + "\n".join(found)
