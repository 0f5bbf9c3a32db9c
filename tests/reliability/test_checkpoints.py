"""Checkpoint files: atomic writes, detection of partial/corrupt ones, safe loading, full disk."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import rloo.runtime.checkpoint.save as ckmod
from rloo import train
from rloo.cli import main
from rloo.errors import RlooError
from rloo.modeling.loading import load_policy, save_pretrained_atomic
from rloo.runtime.checkpoint.verify import (
    MARKER,
    latest_checkpoint,
    list_checkpoints,
    load_state,
    step_of,
    verify_checkpoint,
)
from rloo.runtime.runfolder.atomic import sync_and_hash

from ._helpers import PROMPTS, assert_same_params, leftovers, reward_short
from .conftest import rl_config as _cfg

CLI = [
    "steps=6",
    "batch_size=2",
    "k=2",
    "max_new_tokens=5",
    "lr=3e-3",
    "warmup_steps=2",
    "save_every=2",
    "eval_every=null",
    "eval_prompts=2",
    "eval.batch_size=2",
]


def _copy(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    return out


def test_reference_checkpoints_verify(reference):
    assert [step_of(c) for c in list_checkpoints(reference)] == [4, 6]  # keep_checkpoints=2
    assert all(verify_checkpoint(c) is None for c in list_checkpoints(reference))


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("flip", "model/model.safetensors does not match its checksum"),
        ("truncate", "state.pt has"),
        ("marker", "marker is unreadable"),
    ],
)
def test_corrupt_checkpoint_is_reported_and_skipped(damage, reason, reference, tmp_path, capsys):
    out = _copy(reference, tmp_path)
    newest = out / "checkpoints" / "step-000006"
    if damage == "flip":
        f = newest / "model" / "model.safetensors"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "truncate":
        f = newest / "state.pt"
        f.write_bytes(f.read_bytes()[:100])
    else:
        (newest / MARKER).write_text("{not json")
    assert step_of(latest_checkpoint(out)) == 4
    err = capsys.readouterr().err
    assert f"skipping broken checkpoint {newest}: " in err and reason in err


def test_resume_skips_a_corrupt_newest_checkpoint(reference, tiny_model_dir, tmp_path, capsys):
    out = _copy(reference, tmp_path)
    f = out / "checkpoints" / "step-000006" / "model" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-64])
    shutil.rmtree(out / "model")
    train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert "skipping broken checkpoint" in capsys.readouterr().err
    assert_same_params(reference / "model", out / "model")


def test_partial_checkpoint_folder_is_ignored_and_cleaned(reference, tmp_path, capsys):
    out = _copy(reference, tmp_path)
    partial = out / "checkpoints" / ".tmp-step-000008"
    shutil.copytree(out / "checkpoints" / "step-000006", partial)
    (partial / MARKER).unlink()
    assert step_of(latest_checkpoint(out)) == 6
    assert "skipping unfinished checkpoint" in capsys.readouterr().err
    model, tok = load_policy(str(out / "model"))
    ckmod.save_checkpoint(out, 7, model, tok, {"x": torch.zeros(1)}, keep=3)
    assert not partial.exists()


def test_pickled_code_in_state_is_never_run(reference, tmp_path, capsys):
    """state.pt is loaded with weights_only=True: a pickle that would run code is refused, even
    when an attacker also rewrote the manifest to match."""
    out = _copy(reference, tmp_path)
    newest = out / "checkpoints" / "step-000006"
    marker = tmp_path / "pwned"
    torch.save({"payload": _Evil(marker)}, newest / "state.pt")
    (newest / MARKER).unlink()
    (newest / MARKER).write_text(json.dumps({"step": 6, "files": sync_and_hash(newest)}))
    assert verify_checkpoint(newest) is None
    assert step_of(latest_checkpoint(out)) == 4
    assert "state.pt does not load" in capsys.readouterr().err
    assert not marker.exists()


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.mark.parametrize("model_type", ["llama", "evil"])
def test_remote_code_is_not_run(model_type, tiny_model_dir, tmp_path):
    """A model folder that points at custom code (auto_map) never gets that code run: a known
    architecture loads with the library's own class, an unknown one is refused with a clear error."""
    model = tmp_path / "custom"
    shutil.copytree(tiny_model_dir, model)
    marker = tmp_path / "pwned"
    (model / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel\n"
    )
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    cfg["model_type"] = model_type
    (model / "config.json").write_text(json.dumps(cfg))
    if model_type == "llama":
        loaded, _ = load_policy(str(model))
        assert type(loaded).__module__.startswith("transformers.models.llama")
    else:
        with pytest.raises(RlooError, match=f"could not load a causal LM from '{model}'"):
            load_policy(str(model))
    assert not marker.exists()


def _enospc(*a, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_while_checkpointing(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """ENOSPC while writing checkpoint 4: one clear line, checkpoint 2 intact, no half-written folder."""
    out = tmp_path / "run"
    real = ckmod.write_state
    monkeypatch.setattr(ckmod, "write_state", lambda st, p: _enospc() if st["step"] == 4 else real(st, p))
    rc = main(
        ["train", f"policy={tiny_model_dir}", "reward_fn=reliability._helpers:reward_short", f"output_dir={out}", *CLI]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert err.startswith(
        f"rloo train: error: could not write checkpoint {out}/checkpoints/step-000004: no space left on device"
    )
    assert f"the previous checkpoint {out}/checkpoints/step-000002 is intact" in err
    assert [step_of(c) for c in list_checkpoints(out)] == [2] and verify_checkpoint(
        out / "checkpoints" / "step-000002"
    ) is None
    assert not leftovers(out) and not (out / "model").exists()


def test_full_disk_while_saving_the_model_keeps_the_old_one(reference, tmp_path, monkeypatch, capsys):
    out = _copy(reference, tmp_path)
    before = (out / "model" / "model.safetensors").read_bytes()
    model, tok = load_policy(str(out / "model"))

    def half_written(self, path, **kw):  # what safetensors really raises on a full disk
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 10)
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(type(model), "save_pretrained", half_written)
    with pytest.raises(
        Exception,
        match=r"could not save the model to .*: no space left on device .* "
        r"the previous model at .* is untouched",
    ):
        save_pretrained_atomic(model, tok, out / "model")
    assert (out / "model" / "model.safetensors").read_bytes() == before
    assert not leftovers(out)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a small tmpfs")
def test_really_full_disk(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The same on a real full file system (a tmpfs filled up before checkpoint 4)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = mnt / "run"
        real = ckmod.write_model

        def fill_then_write(model, tok, path):
            if path.parent.name == ".tmp-step-000004":
                with open(mnt / "filler", "wb") as fh:
                    try:
                        while True:
                            fh.write(b"\0" * 65536)
                    except OSError:
                        pass
            real(model, tok, path)

        monkeypatch.setattr(ckmod, "write_model", fill_then_write)
        rc = main(
            [
                "train",
                f"policy={tiny_model_dir}",
                "reward_fn=reliability._helpers:reward_short",
                f"output_dir={out}",
                *CLI,
            ]
        )
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert rc == 2 and "could not write checkpoint" in err and "no space left on device" in err, err
        assert [step_of(c) for c in list_checkpoints(out)] == [2]
        assert verify_checkpoint(out / "checkpoints" / "step-000002") is None and not leftovers(out)
        load_state(out / "checkpoints" / "step-000002")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
