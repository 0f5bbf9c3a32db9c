"""`--overwrite` of every command deletes only the command's own files (rloo.runtime.runfolder.layout).

For each kind of output folder (train, compare, sft, reward, eval, pipeline, bench) a finished run
is copied, one thing is planted at a random place in it (seeded: the folder and the owned file are
drawn), and the command's overwrite is run:
  user_file, user_dir   a user's file, a folder holding one           -> refused, nothing deleted
  link_out              a link (to a file outside) at a name rloo does not write -> refused
  nested_run            another rloo run (an eval run) at a name rloo does not write -> refused
  held_lock             a live process holds the lock of the folder or of a run inside it -> refused
  link_owned            one of rloo's files or folders replaced by a link to a user's file/folder
                        outside                                       -> done: the link is removed,
                                                                         its target is untouched
train runs the real `rloo train --overwrite` and compare the real `rloo compare --overwrite` (its
cells and report stubbed out after the folder is emptied: the deletion is all that is tested here);
the stages call the function they start with (prepare_output_dir / prepare_plain_folder).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

import rloo.experiments.compare.study as compare_mod
from rloo.cli import main
from rloo.config import EvalConfig, PipelineConfig, RewardConfig, SFTConfig, save_config
from rloo.errors import RlooError
from rloo.runtime.runfolder.layout import BOOKKEEPING, MARKER, kind_of
from rloo.runtime.runfolder.lock import run_folder
from rloo.training.common import prepare_output_dir, prepare_plain_folder

from ._runner import start_lock_holder
from .conftest import TRAIN, tiny_study_config

KINDS = ["train", "compare", "sft", "reward", "eval", "pipeline", "bench"]
PLANTS = ["user_file", "user_dir", "link_out", "nested_run", "held_lock", "link_owned"]
SEEDS = [0, pytest.param(1, marks=pytest.mark.slow)]  # the second draw of places in the slow tier


def _tree(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(Path(folder).rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def _mark(folder: Path, kind: str) -> None:
    (folder / MARKER).write_text(json.dumps({"kind": kind}))


@pytest.fixture(scope="module")
def templates(tiny_study, train_run, tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """A finished folder of each kind: real runs for train, compare, sft, reward (the study's) and
    eval; pipeline and bench assembled from real runs' folders (their stages are slow)."""
    root = tmp_path_factory.mktemp("templates")
    cell = tiny_study / "runs" / "summarize" / "seed-0"
    ev = root / "eval"
    assert main(["eval", f"policy={tiny_model_dir}", "num_prompts=2", f"output_dir={ev}"]) == 0
    pipe = root / "pipeline"
    pipe.mkdir()
    _mark(pipe, "pipeline")
    save_config(PipelineConfig(output_dir=pipe), pipe / "config.yaml")
    (pipe / "summary.json").write_text("{}")
    for name, src in (("sft", cell / "sft"), ("reward", cell / "reward"), ("rl", train_run), ("eval", ev)):
        shutil.copytree(src, pipe / name, symlinks=True)
    bench = root / "bench"
    (bench / "assets" / "S").mkdir(parents=True)
    _mark(bench, "bench")
    (bench / "bench.json").write_text("{}")
    for sub in ("policy", "reward"):
        shutil.copytree(tiny_model_dir, bench / "assets" / "S" / sub)
    (bench / "assets" / "S" / "words.txt").write_text("a\nb")
    return {
        "train": train_run,
        "compare": tiny_study,
        "sft": cell / "sft",
        "reward": cell / "reward",
        "eval": ev,
        "pipeline": pipe,
        "bench": bench,
    }


def _dirs(out: Path) -> list[Path]:
    return [out, *sorted(p for p in out.rglob("*") if p.is_dir() and not p.is_symlink())]


def _plant(plant: str, out: Path, outside: Path, rng: random.Random, templates) -> list[Path]:
    """Plant one thing; returns the user's paths that must survive (inside and outside)."""
    where = rng.choice(_dirs(out))
    victim = outside / "victim.txt"
    victim_dir = outside / "victim_dir"
    if plant == "user_file":
        (where / "notes.txt").write_text("my notes")
        return [where / "notes.txt", victim]
    if plant == "user_dir":
        (where / "thesis").mkdir()
        (where / "thesis" / "ch1.tex").write_text("chapter one")
        return [where / "thesis" / "ch1.tex", victim]
    if plant == "link_out":
        os.symlink(rng.choice([victim, victim_dir]), where / "link-to-mine")
        return [victim, victim_dir / "a.txt"]
    if plant == "nested_run":
        shutil.copytree(templates["eval"], where / "my-eval")
        return [where / "my-eval" / "summary.json", victim]
    if plant == "link_owned":
        owned = rng.choice([p for p in out.rglob("*") if p.name not in BOOKKEEPING and p != out / "config.yaml"])
        shutil.rmtree(owned) if owned.is_dir() else owned.unlink()
        os.symlink(victim_dir if rng.random() < 0.5 else victim, owned)
        return [victim, victim_dir / "a.txt"]
    raise ValueError(plant)


def _run_overwrite(kind: str, out: Path, tiny_model_dir: Path, tmp_path: Path, capsys) -> tuple[bool, str]:
    """The command's --overwrite on `out`: (done, its error line)."""
    if kind == "train":
        rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN, "--overwrite"])
        return rc == 0, capsys.readouterr().err
    if kind == "compare":
        config = tmp_path / "tiny.yaml"
        save_config(tiny_study_config(out), config)
        rc = main(["compare", "--config", str(config), "--overwrite"])
        return rc == 0, capsys.readouterr().err
    cfg = {
        "sft": lambda: SFTConfig(output_dir=out),
        "reward": lambda: RewardConfig(sft_model=str(tiny_model_dir), output_dir=out),
        "eval": lambda: EvalConfig(policy=str(tiny_model_dir), output_dir=out),
        "pipeline": lambda: PipelineConfig(output_dir=out),
        "bench": lambda: None,
    }[kind]()
    try:
        with run_folder(out):
            prepare_plain_folder(out, "bench", True) if kind == "bench" else prepare_output_dir(cfg, overwrite=True)
    except RlooError as e:
        return False, str(e)
    return True, ""


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("plant", PLANTS)
@pytest.mark.parametrize("kind", KINDS)
def test_overwrite_deletes_only_the_commands_own_files(
    kind, plant, seed, templates, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(compare_mod, "_reported_cells", lambda *a: None)  # the deletion is under test
    monkeypatch.setattr(compare_mod, "write_report", lambda cfg, out: Path(out) / "report")
    outside = tmp_path / "outside"
    (outside / "victim_dir").mkdir(parents=True)
    (outside / "victim.txt").write_text("a user's file")
    (outside / "victim_dir" / "a.txt").write_text("a user's folder")
    out = tmp_path / kind
    shutil.copytree(templates[kind], out, symlinks=True)
    rng = random.Random(f"{kind}/{plant}/{seed}")
    holder = None
    if plant == "held_lock":  # the folder itself, or a run inside it
        runs = [d for d in _dirs(out) if kind_of(d) is not None or d.name.startswith("seed-")]
        holder = start_lock_holder(rng.choice(runs), tmp_path, shared=False)
        survivors = [outside / "victim.txt"]
    else:
        survivors = _plant(plant, out, outside, rng, templates)
    before_out, before_outside = _tree(out), _tree(outside)
    try:
        done, err = _run_overwrite(kind, out, tiny_model_dir, tmp_path, capsys)
    finally:
        if holder is not None:
            holder.kill()
            holder.join()
    assert _tree(outside) == before_outside, "something outside the output folder changed"
    for p in survivors:
        assert p.exists(), f"{p} was deleted"
    if plant == "link_owned":
        assert done, err
        assert not [p for p in out.rglob("*") if p.is_symlink()], "the planted link is still there"
        if kind != "train":  # the folder was emptied (train's run has written its files again)
            assert {p.name for p in out.iterdir()} <= BOOKKEEPING | {"config.yaml"}
    else:
        assert not done, "the overwrite went ahead"
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "nothing was deleted" in err or "is in use by" in err, err
        assert _tree(out) == before_out, "a refused overwrite changed the folder"
