"""Round five (issue 58): a checkpoint whose state was changed by hand, its manifest re-hashed so the
checksums vouch for it, is refused in one line on `--resume` (exit 2, the run folder unchanged).
Before: a state whose `extra` was not JSON was a 31-line JSONDecodeError in
training/supervised.py (SFT) and training/reward.py (reward model); an RL state whose `config` was
not JSON, likewise in training/rl.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from rloo.cli import main

from .conftest import TRAIN
from .test_bad_input import _files, _one_line

ARCH = ["arch.hidden_size=32", "arch.num_layers=1", "arch.num_heads=2", "arch.intermediate_size=64"]
# 2 steps each, a checkpoint after each
SFT = ["num_examples=32", "epochs=1", "batch_size=16", "save_every=1", "report_to=none", *ARCH]
REWARD = ["num_pairs=32", "eval_pairs=8", "epochs=1", "batch_size=16", "save_every=1", "report_to=none"]


DELETE = None  # a `value` of tamper(): the key is removed from the state


def tamper(ckpt: Path, key: str, value: str | None) -> None:
    """Set `key` of the checkpoint's state to `value` (DELETE: remove it) and re-hash its manifest (as a
    careful hand would)."""
    state = torch.load(ckpt / "state.pt", weights_only=True)
    if value is DELETE:
        del state[key]
    else:
        state[key] = value
    torch.save(state, ckpt / "state.pt")
    manifest = json.loads((ckpt / "COMPLETE").read_text())
    manifest["files"] = {
        str(p.relative_to(ckpt)): [p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "COMPLETE"
    }
    (ckpt / "COMPLETE").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def stage_runs(tiny_model_dir, tmp_path_factory):
    """A finished 2-step SFT and reward-model run, each with checkpoints at steps 1 and 2 (read-only)."""
    root = tmp_path_factory.mktemp("stages")
    argv = {
        "sft": ["sft", f"model={tiny_model_dir}", f"output_dir={root / 'sft'}", *SFT],
        "reward": ["reward", f"sft_model={tiny_model_dir}", f"output_dir={root / 'reward'}", *REWARD],
    }
    for args in argv.values():
        assert main(args) == 0
    return root, argv


@pytest.mark.parametrize(
    "stage, key, value, needle",
    [
        ("sft", "extra", "{not json", "its state's 'extra' is not JSON"),
        ("reward", "extra", "{not json", "its state's 'extra' is not JSON"),
        ("reward", "extra", "[1, 2]", "its state's 'extra' holds a JSON list, not an object"),
        ("reward", "extra", '{"pairs": {"train": [1], "held_out": []}}', "preference pairs are not the lists"),
        ("sft", "config", "null", "its state's 'config' holds a JSON NoneType, not an object"),
        # a key removed: a 27-line KeyError, and SFT had rewritten config.yaml first (round five's retry)
        ("sft", "extra", DELETE, "its state has no 'extra'"),
        ("sft", "rng", DELETE, "its state has no 'rng'"),
        ("reward", "extra", DELETE, "its state has no 'extra'"),
    ],
    ids=[
        "sft-extra",
        "reward-extra",
        "reward-extra-list",
        "reward-pairs",
        "sft-config",
        "sft-no-extra",
        "sft-no-rng",
        "reward-no-extra",
    ],
)
def test_resume_refuses_a_tampered_stage_state(stage, key, value, needle, stage_runs, tmp_path, capsys):
    root, argv = stage_runs
    out = tmp_path / stage
    shutil.copytree(root / stage, out)
    tamper(out / "checkpoints" / "step-000002", key, value)
    before = _files(out)
    args = [a if not a.startswith("output_dir=") else f"output_dir={out}" for a in argv[stage]]
    capsys.readouterr()
    rc = main([*args, "--resume"])
    err = capsys.readouterr().err.strip()
    _one_line(rc, err, "error: cannot resume from ", needle, progress_before=True)
    assert _files(out) == before, "the run folder was changed"


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("config", "{not json", "its state's 'config' is not JSON"),
        ("stream", DELETE, "its state has no 'stream'"),  # a KeyError after the run folder was written
        ("counters", DELETE, "its state has no 'counters'"),
    ],
    ids=["config", "no-stream", "no-counters"],
)
def test_resume_refuses_a_tampered_rl_config(key, value, needle, train_run, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(train_run, out)
    tamper(out / "checkpoints" / "step-000002", key, value)
    before = _files(out)
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN, "--resume"])
    err = capsys.readouterr().err.strip()
    _one_line(rc, err, "error: cannot resume from ", needle, progress_before=True)
    assert _files(out) == before, "the run folder was changed"
