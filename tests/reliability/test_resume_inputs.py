"""A resume continues the run it claims to: inputs (policy, reward model, dataset) are checked by
content, a refused resume leaves the folder (config.yaml included) untouched, `steps` may grow;
--overwrite never deletes an input of the run; pruning after a fallback keeps the good checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from rloo import train
from rloo.cli import main
from rloo.errors import RlooError
from rloo.runtime.checkpoint.verify import list_checkpoints, step_of, verify_checkpoint

from ._helpers import PROMPTS, metric_steps, reward_short
from .conftest import rl_config as _cfg
from .test_bad_input import _files, _one_line
from .test_resume import _signal_after

CLI = ["steps=4", "batch_size=2", "k=2", "max_new_tokens=4", "eval_every=null", "save_every=2", "lr=3e-3"]


def _perturb(model_dir):
    """The same architecture with other weights: what `cp -r other_model policy` leaves behind."""
    f = model_dir / "model.safetensors"
    weights = load_file(str(f))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(f))


@pytest.fixture
def inputs(tiny_model_dir, tmp_path):
    policy, rm = tmp_path / "policy", tmp_path / "rm"
    shutil.copytree(tiny_model_dir, policy)
    shutil.copytree(tiny_model_dir, rm)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 2))
    return {"policy": policy, "reward_model": rm, "dataset.path": data}


def _interrupted(inputs, out, monkeypatch, capsys):
    args = [
        "train",
        *(f"{k}={v}" for k, v in inputs.items()),
        "reward_fn=reliability._helpers:reward_short",
        "eval_prompts=2",
        f"output_dir={out}",
        *CLI,
    ]
    _signal_after(monkeypatch, 3)
    assert main(args) == 128 + 15
    monkeypatch.undo()
    capsys.readouterr()
    return args


@pytest.mark.parametrize("changed", ["policy", "reward_model", "dataset.path"])
def test_resume_refuses_an_input_changed_since_the_interrupt(changed, inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = _interrupted(inputs, out, monkeypatch, capsys)
    if changed == "dataset.path":
        inputs[changed].write_text(inputs[changed].read_text().replace("job rent", "job home"))
    else:
        _perturb(inputs[changed])
    before = _files(out)
    rc = main([*args, "--resume"])
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"cannot resume: {changed}={inputs[changed]} is not the same ",
        "the run started with",
        "restore the original, or pass --overwrite",
    )
    assert _files(out) == before, "a refused resume changes nothing (config.yaml included)"


def test_resume_with_the_same_inputs_is_accepted(inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = _interrupted(inputs, out, monkeypatch, capsys)
    assert main([*args, "--resume"]) == 0, capsys.readouterr().err
    assert metric_steps(out) == [1, 2, 3, 4]


def test_steps_may_grow_on_resume(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The built-in task's prompt list depends on steps; a resume keeps the run's own list."""
    out = tmp_path / "run"
    args = [
        "train",
        f"policy={tiny_model_dir}",
        "reward_fn=reliability._helpers:reward_short",
        "eval_prompts=2",
        f"output_dir={out}",
        *CLI,
    ]
    _signal_after(monkeypatch, 3)
    assert main(args) == 128 + 15
    monkeypatch.undo()
    capsys.readouterr()
    rc = main([*args, "steps=6", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "resuming with changed settings (still an exact continuation): steps: 4 -> 6" in err
    assert metric_steps(out) == [1, 2, 3, 4, 5, 6]
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 6
    assert main([*args, "steps=8", "--resume"]) == 0, capsys.readouterr().err  # and once more
    assert metric_steps(out) == list(range(1, 9))


def test_refused_resume_does_not_rewrite_config(reference, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = _files(out)
    with pytest.raises(RlooError, match="training prompts differ"):
        train(_cfg(tiny_model_dir, out, steps=8, lr=1e-3), prompts=PROMPTS[:3], reward_fn=reward_short, resume=True)
    with pytest.raises(RlooError, match="newest checkpoint is at step 6, past steps=5; pass steps >= 6"):
        train(_cfg(tiny_model_dir, out, steps=5), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert _files(out) == before


@pytest.mark.parametrize("inside", ["policy", "dataset.path"])
def test_overwrite_never_deletes_an_input_inside_the_folder(inside, inputs, tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "train",
        f"policy={inputs['policy']}",
        "reward_fn=reliability._helpers:reward_short",
        "eval_prompts=2",
        f"output_dir={out}",
        *CLI,
        "steps=2",
    ]
    assert main(args) == 0
    if inside == "policy":  # continue training from the run's own model, into the same folder
        moved = {"policy": out / "model"}
    else:
        moved = {"dataset.path": out / "prompts.jsonl"}
        shutil.copy(inputs["dataset.path"], moved["dataset.path"])
    capsys.readouterr()
    before = _files(out)
    rc = main([*args, *(f"{k}={v}" for k, v in moved.items()), "--overwrite"])
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"--overwrite would delete {inside}={moved[inside]}: it lies inside {out}",
        "(nothing was deleted)",
    )
    assert _files(out) == before


def test_pruning_after_a_fallback_keeps_the_good_checkpoint(reference, tiny_model_dir, tmp_path, capsys):
    """A broken newest checkpoint (step 5) makes the resume fall back to step 4; when step 6 is
    written, the two kept are 6 and the good 4, not the broken 5."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "model")
    ckpts = out / "checkpoints"
    (ckpts / "step-000006").rename(ckpts / "step-000005")
    weights = ckpts / "step-000005" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert "skipping broken checkpoint" in capsys.readouterr().err
    assert [step_of(c) for c in list_checkpoints(out)] == [4, 6]
    assert all(verify_checkpoint(c) is None for c in list_checkpoints(out))


def test_a_failed_prune_is_reported(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """shutil.rmtree that cannot delete step 2 (a read-only mount, a busy NFS file): reported as it
    would report it, through its error handler, or silently with ignore_errors as the old code did."""
    real = shutil.rmtree

    def rmtree(path, ignore_errors=False, onerror=None, **kw):
        if str(path).endswith("step-000002"):
            err = PermissionError(13, "Permission denied", str(path))
            if ignore_errors:
                return None
            if onerror is not None:
                return onerror(torch.__class__, str(path), (PermissionError, err, None))
            raise err
        return real(path, ignore_errors=ignore_errors, onerror=onerror, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    out = tmp_path / "run"
    train(_cfg(tiny_model_dir, out, keep_checkpoints=1), prompts=PROMPTS, reward_fn=reward_short)
    err = capsys.readouterr().err
    assert f"could not delete old checkpoint {out}/checkpoints/step-000002 (PermissionError" in err, err
    assert [step_of(c) for c in list_checkpoints(out)] == [2, 6]
