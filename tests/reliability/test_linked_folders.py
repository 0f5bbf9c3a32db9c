"""A folder rloo writes or deletes in, inside a run folder, replaced by a symbolic link to a user's
folder outside: the command refuses in one line (exit 2) that names the link, and the user's folder
is left byte for byte, nothing added or removed (rloo.runtime.runfolder.confine; the start-up check
rloo.runtime.runfolder.layout.refuse_linked_folders). Before, `rloo train --resume` overwrote the user's
plots through a linked `plots/`, wrote checkpoints into a linked `checkpoints/` and pruned the
user's `step-*` there, and added TensorBoard events to a linked `tensorboard/`: O_NOFOLLOW and the
atomic rename protect only the last component of a path.

Every case copies a finished run (the session fixtures), moves one of its folders out to a user's
folder (adding a file of the user's) and links it back, as `ln -s ../../userplots run/plots` does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.config import EvalConfig, PipelineConfig, RewardConfig, RLConfig, SFTConfig, load_config, save_config
from rloo.errors import RlooError
from rloo.runtime.runfolder.lock import run_folder
from rloo.training.common import prepare_output_dir, prepare_plain_folder

from .conftest import TRAIN, tiny_study_config
from .test_overwrite_property import _tree


def _link_out(out: Path, rel: str, tmp_path: Path, mine: bool = True) -> Path:
    """Move `out/rel` to a user's folder outside `out` (`mine`: a file of the user's added) and put
    a relative link to it in its place; returns the user's folder."""
    inside = out / rel
    user = tmp_path / "user" / rel.replace("/", "_")
    user.parent.mkdir(exist_ok=True)
    shutil.move(inside, user) if inside.exists() else user.mkdir()
    if mine:
        (user / "mine.txt").write_text("a user's file")
    inside.symlink_to(os.path.relpath(user, inside.parent))
    return user


def _refused(rc: int, err: str, link: Path) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{link} is a symbolic link" in lines[0], lines[0]


def _resume(policy: Path, out: Path, capsys, *extra: str) -> tuple[int, str]:
    steps = [a if not a.startswith("steps=") else "steps=3" for a in TRAIN]
    rc = main(["train", f"policy={policy}", f"output_dir={out}", *steps, *extra, "--resume"])
    return rc, capsys.readouterr().err


TRAIN_FOLDERS = [
    "plots",
    "checkpoints",
    "tensorboard",
    "model",
    "checkpoints/step-000001",  # the one pruning deletes
    "checkpoints/step-000002/model",
]


@pytest.mark.parametrize("rel", TRAIN_FOLDERS)
def test_train_resume_refuses_a_linked_folder(rel, train_run, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(train_run, out, symlinks=True)
    user = _link_out(out, rel, tmp_path)
    before, inside = _tree(user), _tree(out)
    rc, err = _resume(tiny_model_dir, out, capsys)
    assert _tree(user) == before, "the user's folder changed"
    _refused(rc, err, out / rel)
    assert _tree(out) == inside, "a refused run changed its folder"


def test_train_resume_refuses_a_linked_ring(async_run, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(async_run, out, symlinks=True)
    rel = "checkpoints/step-000002/ring"
    user = _link_out(out, rel, tmp_path)
    before = _tree(user)
    rc, err = _resume(tiny_model_dir, out, capsys, "max_staleness=1")
    assert _tree(user) == before
    _refused(rc, err, out / rel)


def test_python_api_resume_refuses_a_linked_folder(train_run, tiny_model_dir, tmp_path):
    """The check is the stage's own (prepare_output_dir), not only the command line's."""
    from rloo import train

    out = tmp_path / "run"
    shutil.copytree(train_run, out, symlinks=True)
    user = _link_out(out, "plots", tmp_path)
    before = _tree(user)
    steps = [a if not a.startswith("steps=") else "steps=3" for a in TRAIN]
    cfg = load_config(RLConfig, None, [f"policy={tiny_model_dir}", f"output_dir={out}", *steps])
    with pytest.raises(RlooError, match=f"{out / 'plots'} is a symbolic link"):
        train(cfg, resume=True)
    assert _tree(user) == before


COMPARE_FOLDERS = [
    "report",
    "runs/summarize",
    "runs/summarize/seed-0",
    "runs/summarize/seed-0/rloo",
    "runs/summarize/seed-0/sft",
    "runs/summarize/seed-0/rloo/tensorboard",
]


@pytest.mark.parametrize("rel", COMPARE_FOLDERS)
def test_compare_rerun_refuses_a_linked_folder(rel, tiny_study, tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(tiny_study, out, symlinks=True)
    save_config(tiny_study_config(out), out / "config.yaml")  # the copy's own output_dir: a rerun of it
    user = _link_out(out, rel, tmp_path)
    if rel == "report":  # the user's own files there (a rerun would write the same report again)
        for f in user.iterdir():
            f.write_bytes(b"the user's " + f.name.encode())
    before = _tree(user)
    config = tmp_path / "tiny.yaml"
    save_config(tiny_study_config(out), config)
    rc = main(["compare", "--config", str(config)])
    err = capsys.readouterr().err
    assert _tree(user) == before
    _refused(rc, err, out / rel)


# A pipeline never continues in a finished folder (it is refused, or emptied by --overwrite, which
# unlinks links); its stage folders are made while it runs. So a stage folder linked after the
# pipeline took its folder: each stage starts as the pipeline starts it, inside the held folder.
STAGES = {
    "sft": lambda m, d: SFTConfig(output_dir=d),
    "reward": lambda m, d: RewardConfig(sft_model=str(m), output_dir=d),
    "rl": lambda m, d: RLConfig(policy=str(m), output_dir=d),
    "eval": lambda m, d: EvalConfig(policy=str(m), output_dir=d),
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_pipeline_stage_never_starts_in_a_linked_folder(stage, tiny_model_dir, tmp_path):
    pipe = tmp_path / "pipe"
    with run_folder(pipe):
        prepare_output_dir(PipelineConfig(output_dir=pipe))
        user = _link_out(pipe, stage, tmp_path, mine=False)  # a fresh folder of the user's
        before = _tree(user)
        with pytest.raises(RlooError, match=f"{pipe / stage} is a symbolic link"), run_folder(pipe / stage):
            prepare_output_dir(STAGES[stage](tiny_model_dir, pipe / stage))
    assert _tree(user) == before, "the stage wrote into the user's folder"


def test_bench_refuses_linked_assets(tiny_model_dir, tmp_path):
    out = tmp_path / "bench"
    with run_folder(out):
        prepare_plain_folder(out, "bench", False)
    for sub in ("policy", "reward"):
        shutil.copytree(tiny_model_dir, out / "assets" / "S" / sub)
    for rel in ("assets/S", "assets"):
        user = _link_out(out, rel, tmp_path)
        before = _tree(user)
        with pytest.raises(RlooError, match=f"{out / rel} is a symbolic link"), run_folder(out):
            prepare_plain_folder(out, "bench", False)
        assert _tree(user) == before
        (out / rel).unlink()
        shutil.move(user, out / rel)


def test_every_writer_refuses_a_path_under_a_linked_folder(tiny_model_dir, tmp_path):
    """The guard in the writers themselves (a link planted after the start-up check): each refuses
    before it writes or deletes anything under `run/sub`, a link to the user's folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.eval.plots import plot_training
    from rloo.modeling.loading import save_pretrained_atomic
    from rloo.runtime.checkpoint.save import save_checkpoint
    from rloo.runtime.runfolder.atomic import (
        atomic_savefig,
        atomic_write_text,
        open_append,
        remove_tree,
        remove_tree_reporting,
        truncate_file,
    )
    from rloo.runtime.tracking.log import MetricsLogger
    from rloo.runtime.tracking.trackers import TensorBoardTracker

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "reward/score": 1.0}\n')
    with run_folder(out):
        user = _link_out(out, "sub", tmp_path)
        (user / "step-000001").mkdir()
        (user / "step-000001" / "state.pt").write_text("the user's")
        before = _tree(user)
        link = out / "sub"
        writers = {
            "atomic_write_text": lambda: atomic_write_text(link / "summary.json", "{}"),
            "atomic_savefig": lambda: atomic_savefig(None, link / "reward.png"),
            "open_append": lambda: open_append(link / "metrics.jsonl"),
            "truncate_file": lambda: truncate_file(link / "mine.txt", 0),
            "remove_tree": lambda: remove_tree(link / "step-000001"),
            "remove_tree_reporting": lambda: remove_tree_reporting(link / "step-000001"),
            "save_pretrained_atomic": lambda: save_pretrained_atomic(model, tok, link / "model"),
            "save_checkpoint": lambda: save_checkpoint(link, 2, model, tok, {}),
            "TensorBoardTracker": lambda: TensorBoardTracker(link),
            "MetricsLogger": lambda: MetricsLogger(link / "eval"),
            "plot_training": lambda: plot_training(tmp_path / "metrics.jsonl", link / "plots"),
        }
        for name, write in writers.items():
            with pytest.raises(RlooError, match=f"{link} is a symbolic link"):
                write()
            assert _tree(user) == before, f"{name} changed the user's folder"


def test_overwrite_of_an_async_run_deletes_its_ring(async_run, tiny_model_dir, tmp_path, capsys):
    """ring/ is rloo's (the checkpoint layout names it): --overwrite of a run at max_staleness > 0
    empties the folder instead of refusing the ring as a user's folder."""
    out = tmp_path / "run"
    shutil.copytree(async_run, out, symlinks=True)
    steps = [a if not a.startswith("steps=") else "steps=1" for a in TRAIN]
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *steps, "--overwrite"])
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]


def test_a_run_folder_that_lies_under_a_link_is_used(tiny_model_dir, tmp_path):
    """The control: links above the run folder (an output_dir under a linked home folder) are the
    user's choice, and everything below it is written and deleted as before."""
    from rloo.runtime.runfolder.atomic import atomic_write_text, remove_tree
    from rloo.runtime.runfolder.confine import make_folder
    from rloo.runtime.runfolder.layout import refuse_linked_folders

    (tmp_path / "disk").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "disk")
    out = tmp_path / "home" / "runs" / "ev"
    with run_folder(out):
        prepare_output_dir(EvalConfig(policy=str(tiny_model_dir), output_dir=out))
        atomic_write_text(make_folder(out / "plots" / "deeper") / "a.txt", "x")
        remove_tree(out / "plots" / "deeper")
        refuse_linked_folders(out, "eval")
    written = sorted(p.name for p in (tmp_path / "disk" / "runs" / "ev").iterdir())
    assert written == [".rloo-run", "config.yaml", "plots"]
