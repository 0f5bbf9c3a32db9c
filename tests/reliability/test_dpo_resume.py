"""DPO (`rloo train algorithm=dpo`) stopped by SIGINT/SIGTERM (a checkpoint written) or SIGKILL (after a
periodic checkpoint) and resumed ends with parameters bitwise equal to an uninterrupted run's and the
same metrics.jsonl byte for byte, periodic evaluations included, as SFT and the reward model do
(tests/reliability/test_stage_resume.py). Every child runs the real CLI with one torch thread
(reliability._runner). Before, DPO wrote no checkpoint ("nothing saved (dpo has no checkpoints)") and
refused --resume ("dpo runs are short and offline: resume is not supported")."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from rloo.runtime.checkpoint.verify import list_checkpoints, step_of

from ._helpers import assert_same_params, params
from ._runner import run_cli

# 24 fresh reference pairs (no reward model), batches of 8, 2 epochs: 6 steps, 3 per epoch;
# checkpoints at 2, 4, 6; an evaluation before steps 1, 3, 5 and after the last. The records, in order:
# eval@0, 1, 2, eval@2, 3, 4, eval@4, 5, 6, eval@6 (RECORDS: their steps)
DPO = [
    "algorithm=dpo",
    "algorithm_settings.dpo_pairs=24",
    "algorithm_settings.dpo_batch_size=8",
    "algorithm_settings.dpo_epochs=2",
    "save_every=2",
    "eval_every=2",
    "eval_prompts=4",
    "max_new_tokens=4",
    "report_to=none",
]
RECORDS = [0, 1, 2, 2, 3, 4, 4, 5, 6, 6]


def _dpo(out: Path, policy: Path) -> list[str]:
    return ["train", f"policy={policy}", f"output_dir={out}", *DPO]


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _last(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dpo_reference(tiny_model_dir, tmp_path_factory):
    """A DPO run never stopped (read-only: copy it before changing it)."""
    out = tmp_path_factory.mktemp("dporef") / "run"
    rc, text = run_cli(_dpo(out, tiny_model_dir), out.parent / "log.txt")
    assert rc == 0, text
    # the faults below are placed by record number: the records must be the ones listed above
    assert [r["step"] for r in _records(out)] == RECORDS
    assert "eval at step 2/6 (" in text and "/100 (" not in text  # DPO's steps, not rl.steps' default
    return out


@pytest.mark.parametrize(
    ("fault", "stopped", "saved"),
    [
        ("int-log@4", 3, 3),  # right after the evaluation at step 2: step 3, an epoch's end, then the stop
        ("term-log@6", 4, 4),  # after step 4, a save_every step: its one checkpoint
        ("kill-log@8", None, 4),  # after step 5: from step 4's periodic checkpoint, its evaluation again
    ],
)
def test_dpo_stopped_then_resumed_equals_uninterrupted(fault, stopped, saved, dpo_reference, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rc, text = run_cli(_dpo(out, tiny_model_dir), tmp_path / "log0.txt", fault)
    if stopped is None:
        assert rc == -signal.SIGKILL, text
    else:
        name = "SIGINT" if fault.startswith("int") else "SIGTERM"
        assert rc == 128 + getattr(signal, name), text
        assert _last(text) == (
            f"rloo train: interrupted: {name} received; dpo stopped at step {stopped}/6 and saved "
            f"{out}/checkpoints/step-{saved:06d}; continue with the same command plus --resume"
        )
    assert max(step_of(c) for c in list_checkpoints(out)) == saved and not (out / "model").exists()
    at_stop = params(out / "checkpoints" / f"step-{saved:06d}" / "model")
    rc, text = run_cli([*_dpo(out, tiny_model_dir), "--resume"], tmp_path / "log1.txt")
    assert rc == 0, text
    assert f"resuming dpo from {out}/checkpoints/step-{saved:06d} at step {saved}" in text
    assert any(not torch.equal(t, params(out / "model")[k]) for k, t in at_stop.items()), "no step after the resume"
    assert_same_params(dpo_reference / "model", out / "model")
    ref = (dpo_reference / "metrics.jsonl").read_text()
    assert (out / "metrics.jsonl").read_text() == ref, "each record written once, with the same values"


def test_dpo_resume_refuses_another_batch_size(dpo_reference, tiny_model_dir, tmp_path):
    """A checkpoint's position counts batches of dpo_batch_size: another one is refused in one line,
    exit 2, the run folder unchanged."""
    out = tmp_path / "run"
    shutil.copytree(dpo_reference, out)
    shutil.rmtree(out / "model")
    before = (out / "metrics.jsonl").read_bytes()
    argv = [*_dpo(out, tiny_model_dir), "algorithm_settings.dpo_batch_size=12", "--resume"]
    rc, text = run_cli(argv, tmp_path / "log.txt")
    assert rc == 2, text
    assert _last(text) == (
        "rloo train: error: cannot resume with different algorithm_settings.dpo_batch_size "
        "(algorithm_settings.dpo_batch_size: 8 -> 12); use the run's original settings, or pass --overwrite "
        "to start a new run"
    )
    assert (out / "metrics.jsonl").read_bytes() == before
