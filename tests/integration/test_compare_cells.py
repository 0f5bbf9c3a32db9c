"""A tuned comparison carried across sessions (rloo.experiments.compare.cells): saved with one trial
and one reported run unfinished, its folder deleted, restored, it resumes with those two runs only
(no SFT or reward model trained again); the update view and the untuned runs reach the report."""

from __future__ import annotations

import json
import shutil

import pytest

import rloo.experiments.compare.report as report_mod
import rloo.experiments.compare.study as compare_mod
from helpers.tiny import no_plots
from rloo.config import RLConfig
from rloo.errors import RlooError
from rloo.experiments.compare import compare
from rloo.experiments.compare.cells import main, restore, save
from rloo.runtime.runfolder.lock import run_folder
from rloo.training.common import prepare_output_dir


def test_a_saved_study_resumes_without_rerunning_its_done_runs(tuned_study, tmp_path, monkeypatch):
    # the shared tuned study (tests/helpers/tuned_study.py), copied: its config's output_dir is
    # relative, so the same config runs on the copy here
    cfg = tuned_study.cfg
    monkeypatch.chdir(tmp_path)
    out, dest = cfg.output_dir, tmp_path / "cells"
    shutil.copytree(tuned_study.out, out)
    text = (out / "report" / "report.md").read_text()
    assert "| ppo@2x2 |" in text and "| rloo@untuned |" in text and "| ppo@untuned |" in text
    cell = out / "runs" / "summarize" / "seed-0"
    ppo = json.loads((cell / "ppo" / "result.json").read_text())["settings"]["algorithm_settings"]
    # the view has its own run only when ppo's overall choice was not at 2x2
    assert (cell / "ppo@2x2" / "result.json").exists() == ((ppo["ppo_epochs"], ppo["num_minibatches"]) != (2, 2))

    # one trial and one reported run unfinished, as when a session ends mid-cell
    (out / "tuning/summarize/seed-5/rloo.t01/result.json").unlink()
    (cell / "rloo@untuned" / "result.json").unlink()
    saved = save(out, dest)
    assert saved["cells_with_models"] == 2  # both cells begun and unfinished: their models travel
    assert (dest / "tuning/summarize/seed-5/sft/model").is_dir() and (
        dest / "runs/summarize/seed-0/reward/model"
    ).is_dir()
    assert (dest / "runs/summarize/seed-0/rloo/metrics.jsonl.gz").exists()
    assert not (dest / "tuning/summarize/seed-5/rloo.t00/metrics.jsonl.gz").exists()  # nothing reads a trial's
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["tuning/summarize/seed-5/rloo.t00"]["cpu"] in {"avx512_bf16", "avx512", "avx2", "other"}

    shutil.rmtree(out)  # the next session: a fresh clone, no run folder
    with pytest.raises(RlooError, match="not empty"):
        restore(dest, dest)
    assert main(["restore", str(dest), str(out)]) == 0
    trained = []

    def spy_train(rl_cfg, **kw):
        trained.append(rl_cfg.output_dir.resolve().relative_to(out.resolve()).as_posix())
        return real_train(rl_cfg, **kw)

    def no_models(*a, **kw):
        raise AssertionError("a saved SFT or reward model was trained again")

    real_train = compare_mod.train
    monkeypatch.setattr(compare_mod, "train", spy_train)
    monkeypatch.setattr(compare_mod, "sft", no_models)
    monkeypatch.setattr(compare_mod, "train_reward", no_models)
    monkeypatch.setattr(report_mod, "plot_all", no_plots)
    report = compare(cfg)
    assert trained == ["tuning/summarize/seed-5/rloo.t01", "runs/summarize/seed-0/rloo@untuned"]
    assert "| rloo@untuned |" in (report / "report.md").read_text()
    # finished now: a second save drops the models it kept for the unfinished cells
    assert save(out, dest)["cells_with_models"] == 0 and not list(dest.rglob("model"))


def _listing(folder):
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_size) for p in folder.rglob("*"))


def test_progress_of_a_folder_that_is_not_a_study_says_so_in_one_short_line(tmp_path, capsys):
    """A train run's folder holds a config.yaml too: read as a comparison's it failed key by key, in
    one line of thousands of characters. Now: one line naming what the folder is and what a study is."""
    run = tmp_path / "run"
    with run_folder(run):  # what `rloo train` writes first, its lock released after
        prepare_output_dir(RLConfig(policy="gpt2", output_dir=run))
    empty = tmp_path / "empty"
    empty.mkdir()
    before = _listing(tmp_path)
    for folder, what in (
        (run, "is an `rloo train` run's folder, not a study"),
        (empty, "holds no rloo run, so it is not a study"),
        (tmp_path / "missing", "does not exist"),
    ):
        assert main(["progress", str(folder)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err == f"error: {folder} {what}; a study is the output_dir of `rloo compare`\n"
    assert _listing(tmp_path) == before  # nothing written
