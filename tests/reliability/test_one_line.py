"""Bad input of every kind is one line from the CLI, exit code 2, and nothing written (the cases
that broke in the adversarial run of issue 16, point 7)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

import rloo.training.loop as online
from rloo.cli import main
from rloo.runtime.checkpoint.verify import MARKER, list_checkpoints, step_of, verify_checkpoint

from ._helpers import leftovers
from .test_bad_input import TINY_RUN, _one_line
from .test_checkpoints import _Evil

TRAIN = ["reward_fn=reliability._helpers:reward_short", *TINY_RUN]


def _train(args, out, capsys, model):
    rc = main(["train", f"policy={model}", f"output_dir={out}", *TRAIN, *args])
    return rc, capsys.readouterr().err.strip()


def test_pickle_only_model_folder(tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, model)
    weights = load_file(str(model / "model.safetensors"))
    marker = tmp_path / "pwned"
    torch.save({**weights, "payload": _Evil(marker)}, model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    out = tmp_path / "run"
    rc, err = _train([], out, capsys, model)
    _one_line(
        rc,
        err,
        "rloo train: error: causal LM folder",
        "has weights only in pickle format (pytorch_model.bin)",
        "rloo loads safetensors only",
    )
    assert not out.exists() and not marker.exists()


def test_binary_config_file(tiny_model_dir, tmp_path, capsys):
    cfg = tmp_path / "model.bin"
    cfg.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "run"
    rc, err = _train(["--config", str(cfg)], out, capsys, tiny_model_dir)
    _one_line(rc, err, f"config file {cfg} is not a text (UTF-8) file")
    assert not out.exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("lr: 0.001\nsteps: 2\nlr: 0.002\n", "key 'lr' appears twice (lines 1 and 3)"),
        ("seed: true\n", "seed: expected an integer, got True (a boolean)"),
        ("share_prompt: 1\n", "share_prompt: expected true or false, got 1 (a number)"),
        ("algo:\n  ppo_epochs: false\n", "algo.ppo_epochs: expected an integer, got False (a boolean)"),
    ],
)
def test_strict_yaml(text, needle, tiny_model_dir, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(text)
    out = tmp_path / "run"
    rc, err = _train(["--config", str(tmp_path / "c.yaml")], out, capsys, tiny_model_dir)
    _one_line(rc, err, needle)
    assert not out.exists()


def test_jsonl_error_names_the_line(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(
        '{"prompt": "post : job tl;dr :"}\n{"prompt": "post : car tl;dr :"}\n'
        '{"prompt": "post : exam tl;dr :"} trailing\n{"prompt": "post : dog tl;dr :"}\n'
    )
    out = tmp_path / "run"
    rc, err = _train([f"dataset.path={data}"], out, capsys, tiny_model_dir)
    _one_line(rc, err, f"dataset '{data}'", "line 3 is not valid JSON (Extra data, column 35)")
    assert not out.exists()


@pytest.fixture
def exiting_reward(tmp_path, monkeypatch):
    """A reward that works for the preflight and step 1, then raises `how` (sys.exit(3) in a
    helper script, a KeyboardInterrupt raised by hand)."""
    (tmp_path / "exiting.py").write_text(
        textwrap.dedent("""
        import sys
        calls = 0
        def exit_later(prompts, completions):
            global calls
            calls += 1
            if calls > 2:
                sys.exit(3)
            return [0.0] * len(completions)
        def interrupt_later(prompts, completions):
            global calls
            calls += 1
            if calls > 2:
                raise KeyboardInterrupt("from the reward")
            return [0.0] * len(completions)
        def exit_at_once(prompts, completions):
            sys.exit(3)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "exiting"
    sys.modules.pop("exiting", None)


@pytest.mark.parametrize("fn, exc", [("exit_later", "SystemExit: 3"), ("interrupt_later", "KeyboardInterrupt")])
def test_reward_that_exits_mid_run(fn, exc, exiting_reward, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_fn={exiting_reward}:{fn}",
            f"output_dir={out}",
            *TINY_RUN,
            "save_every=null",
        ]
    )
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"reward function {fn} raised {exc}",
        f"(at step 2; checkpoint from before it: {out}/checkpoints/step-000001;",
        progress_before=True,
    )
    assert [step_of(c) for c in list_checkpoints(out)] == [1]
    assert verify_checkpoint(out / "checkpoints" / "step-000001") is None
    assert not (out / "model").exists() and not leftovers(out)


def test_reward_that_exits_at_once(exiting_reward, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_fn={exiting_reward}:exit_at_once",
            f"output_dir={out}",
            *TINY_RUN,
        ]
    )
    _one_line(rc, capsys.readouterr().err.strip(), "reward function exit_at_once raised SystemExit: 3")
    assert not out.exists()


def test_missing_complete_marker_is_reported(reference, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "checkpoints" / "step-000006" / MARKER).unlink()
    from rloo.runtime.checkpoint.verify import latest_checkpoint

    assert step_of(latest_checkpoint(out)) == 4
    assert (
        f"skipping broken checkpoint {out}/checkpoints/step-000006: it has no {MARKER} marker"
        in capsys.readouterr().err
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a small tmpfs")
def test_full_disk_while_writing_metrics(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A real full file system (a tmpfs filled after step 1 is logged): one line, no thread traceback."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = mnt / "run"
        real = online.MetricsLogger.log

        def log_then_fill(self, step, metrics):
            real(self, step, metrics)
            if step == 1:
                for t in self._trackers:
                    t.writer.flush()
                with open(mnt / "filler", "wb", buffering=0) as fh:
                    try:
                        while True:
                            fh.write(b"\0" * 4096)
                    except OSError:
                        pass

        monkeypatch.setattr(online.MetricsLogger, "log", log_then_fill)
        # steps=12: tmpfs hands out whole pages, so the metrics file fills its last page first
        rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN, "save_every=null", "steps=12"])
        err = capsys.readouterr().err.strip()
        _one_line(
            rc, err, "rloo train: error: could not write metrics to", "no space left on device", progress_before=True
        )
        assert "Exception in thread" not in err and "Traceback" not in err
        steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if x.endswith("}")]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) < 12 and not (out / "model").exists()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
