"""Issue 28, items 1-4: `--overwrite` never deletes a user's files nor a folder another live process
works in, a planted `.rloo.lock` link is never followed, and a compare cell whose inputs another
process is making waits for them. Every refusal is one line, exit code 2, with nothing deleted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import rloo.experiments.compare.folder as compare_folder
from rloo.cli import main
from rloo.config import save_config
from rloo.errors import RlooError
from rloo.experiments.compare import compare

from ._runner import start_lock_holder
from .conftest import TRAIN, tiny_study_config


def _one_line(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every path under `folder` (links not followed): a file's bytes, a link's target, "dir"."""
    out: dict[str, bytes | str] = {}
    for p in sorted(Path(folder).rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def _study_cli(tmp_path: Path, out: Path) -> list[str]:
    """The CLI command of the tiny comparison (its settings in a --config file) with --overwrite."""
    config = tmp_path / "tiny.yaml"
    save_config(tiny_study_config(out), config)
    return ["compare", "--config", str(config), "--overwrite"]


# ---- item 1: a user's files ----------------------------------------------------------------------


def test_compare_overwrite_never_deletes_a_folder_of_user_files(tmp_path, capsys):
    out = tmp_path / "DIR"
    (out / "thesis").mkdir(parents=True)
    (out / "thesis" / "ch1.tex").write_text("chapter one")
    (out / "notes.txt").write_text("my notes")
    before = _tree(out)
    rc, err = _cli(_study_cli(tmp_path, out), capsys)
    _one_line(rc, err, f"{out} is not empty and does not hold an rloo compare", "nothing was deleted")
    assert _tree(out) == before


def test_compare_overwrite_refuses_a_study_holding_a_users_file(tiny_study, tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(tiny_study, out, symlinks=True)
    planted = out / "runs" / "summarize" / "seed-0" / "rloo" / "thesis" / "ch1.tex"
    planted.parent.mkdir()
    planted.write_text("chapter one")
    before = _tree(out)
    rc, err = _cli(_study_cli(tmp_path, out), capsys)
    _one_line(rc, err, f"--overwrite would delete {planted.parent}, which rloo did not write", "nothing was deleted")
    assert _tree(out) == before


# ---- item 2: a folder another live process works in ----------------------------------------------


@pytest.mark.parametrize("held", ["study", "cell"])
def test_compare_overwrite_refuses_a_folder_in_use(held, tiny_study, tmp_path, capsys):
    """study: another `rloo compare` between cells (its shared lock on the folder); cell: one
    inside a cell (the cell's run lock)."""
    out = tmp_path / "cmp"
    shutil.copytree(tiny_study, out, symlinks=True)
    folder = out if held == "study" else out / "runs" / "summarize" / "seed-0"
    holder = start_lock_holder(folder, tmp_path, shared=held == "study")
    try:
        before = _tree(out)
        rc, err = _cli(_study_cli(tmp_path, out), capsys)
        with pytest.raises(RlooError, match="is in use by process"):  # the same from Python
            compare(tiny_study_config(out), overwrite=True)
        after = _tree(out)
    finally:
        holder.kill()
        holder.join()
    _one_line(rc, err, f"{folder} is in use by process {holder.pid}")
    assert after == before


# ---- item 3: a planted lock link -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
@pytest.mark.parametrize("flag", ["--resume", "--overwrite", None])
def test_a_planted_lock_link_is_never_followed(how, flag, train_run, tiny_model_dir, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    out = tmp_path / "run"
    if flag is None:  # a fresh run into a folder that holds only the planted link
        out.mkdir()
    else:
        shutil.copytree(train_run, out)
    (os.symlink if how == "symlink" else os.link)(victim, out / ".rloo.lock")
    before = _tree(out)
    argv = ["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN, *([flag] if flag else [])]
    rc, err = _cli(argv, capsys)
    what = "a symbolic link" if how == "symlink" else "hard-linked"
    _one_line(rc, err, f"the lock file {out / '.rloo.lock'} is {what}", "remove it and rerun")
    assert victim.read_text() == "someone else's file"
    assert _tree(out) == before


def test_a_planted_lock_link_in_a_compare_cell_is_never_followed(tiny_study, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    out = tmp_path / "cmp"
    shutil.copytree(tiny_study, out, symlinks=True)
    save_config(tiny_study_config(out), out / "config.yaml")  # the copy's own output_dir
    cell = out / "runs" / "summarize" / "seed-0"
    os.symlink(victim, cell / ".rloo.lock")
    rc, err = _cli(["compare", "--config", str(out / "config.yaml")], capsys)
    _one_line(rc, err, f"the lock file {cell / '.rloo.lock'} is a symbolic link")
    assert victim.read_text() == "someone else's file"


# ---- minor: output_dir= a file -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["eval", "compare", "bench"])
def test_output_dir_that_is_a_file_is_named_a_file(command, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("mine")
    extra = {"eval": [f"policy={tiny_model_dir}", "num_prompts=2"], "compare": [], "bench": ["trl=false"]}[command]
    rc, err = _cli([command, f"output_dir={out}", *extra], capsys)
    _one_line(rc, err, f"output_dir {out} is a file, not a folder")
    assert out.read_text() == "mine"


# ---- item 4: a cell whose inputs another process is making -----------------------------------------


def test_a_cell_waits_for_the_models_another_process_is_making(tmp_path, monkeypatch, capsys):
    """Another process holds seed 0's cell (so its SFT and reward models are being made there) and
    then goes away without making them: the gradient variance, which reads them, waits with a
    progress line, then makes the cell itself; before, it failed ("... seed-0/sft/model does not
    exist")."""
    monkeypatch.setattr(compare_folder, "WAIT_POLL_S", 0.5)
    out = tmp_path / "cmp"
    out.mkdir()
    save_config(tiny_study_config(out), out / "config.yaml")  # the other process started the study
    holder = start_lock_holder(out / "runs" / "summarize" / "seed-0", tmp_path, seconds=4)
    try:
        report = compare(tiny_study_config(out))
    finally:
        holder.join()
    text = capsys.readouterr()
    assert f"waiting for the sft and reward models of {out / 'runs' / 'summarize' / 'seed-0'}" in text.out + text.err
    assert f"process {holder.pid}" in text.out + text.err
    assert (report / "results.json").exists()
    assert (out / "runs" / "summarize" / "seed-0" / "gradient_variance.json").exists()
    assert (out / "runs" / "summarize" / "seed-0" / "rloo" / "result.json").exists()
