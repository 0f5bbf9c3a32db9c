"""SFT and reward-model training stopped by SIGINT/SIGTERM (a checkpoint written) or SIGKILL (after
a periodic checkpoint) and resumed end with parameters bitwise equal to an uninterrupted run's, as
RL's runs do (tests/reliability/test_kill.py); `rloo pipeline --resume` keeps the finished stages
and continues the interrupted one (the reward model's; DPO's as the RL stage), ending with the same
models as a pipeline never stopped. Every child runs the real CLI with one torch thread
(reliability._runner). Before, SFT and the reward model had no checkpoints ("nothing saved"), `rloo
pipeline` had no --resume, and its DPO stage started over. DPO on its own: test_dpo_resume.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from helpers.tiny import TINY_STUDY, as_overrides
from rloo.runtime.checkpoint.verify import list_checkpoints, step_of

from ._helpers import assert_same_params, metric_steps, params
from ._runner import run_cli

# 96 rows, batches of 32, 2 epochs: 6 steps, 3 per epoch; checkpoints at 2, 4, 6
ARCH = ["arch.hidden_size=32", "arch.num_layers=1", "arch.num_heads=2", "arch.intermediate_size=64"]
SFT = ["num_examples=96", "epochs=2", "batch_size=32", "save_every=2", "report_to=none", *ARCH]
REWARD = ["num_pairs=96", "eval_pairs=16", "epochs=2", "batch_size=32", "save_every=2", "report_to=none"]


def _sft(out: Path) -> list[str]:
    return ["sft", f"output_dir={out}", *SFT]


def _reward(out: Path, sft_model: Path) -> list[str]:
    return ["reward", f"output_dir={out}", f"sft_model={sft_model}", *REWARD]


def _finished(argv: list[str], log: Path) -> None:
    rc, text = run_cli(argv, log)
    assert rc == 0, text


@pytest.fixture(scope="module")
def sft_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("sftref") / "run"
    _finished(_sft(out), out.parent / "log.txt")
    return out


@pytest.fixture(scope="module")
def reward_reference(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rmref") / "run"
    _finished(_reward(out, tiny_model_dir), out.parent / "log.txt")
    return out


def _last(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("fault", "saved"),
    [("int-log@3", 3), ("term-log@4", 4), ("kill-log@5", 4)],  # an epoch's end, a checkpoint step, past one
)
def test_sft_stopped_then_resumed_equals_uninterrupted(fault, saved, sft_reference, tmp_path):
    out = tmp_path / "run"
    rc, text = run_cli(_sft(out), tmp_path / "log0.txt", fault)
    at = int(fault.split("@")[1])
    if fault.startswith("kill"):
        assert rc == -signal.SIGKILL, text
    else:
        name = "SIGINT" if fault.startswith("int") else "SIGTERM"
        assert rc == 128 + getattr(signal, name), text
        assert _last(text) == (
            f"rloo sft: interrupted: {name} received; sft stopped at step {at}/6 and saved "
            f"{out}/checkpoints/step-{saved:06d}; continue with the same command plus --resume"
        )
    assert max(step_of(c) for c in list_checkpoints(out)) == saved and not (out / "model").exists()
    at_stop = params(out / "checkpoints" / f"step-{saved:06d}" / "model")
    rc, text = run_cli([*_sft(out), "--resume"], tmp_path / "log1.txt")
    assert rc == 0, text
    assert f"resuming sft from {out}/checkpoints/step-{saved:06d} at step {saved}" in text
    assert any(not torch.equal(t, params(out / "model")[k]) for k, t in at_stop.items()), "no step after the resume"
    assert_same_params(sft_reference / "model", out / "model")
    assert metric_steps(out, "loss/sft") == list(range(1, 7)), "each step logged once across the resume"


@pytest.mark.parametrize(
    ("fault", "stopped", "saved"),
    [("term-log@3", 3, 3), ("kill-log@5", 5, 4), ("int-log@7", 6, 6)],  # 7: the held-out evaluation's record
)
def test_reward_model_stopped_then_resumed_equals_uninterrupted(
    fault, stopped, saved, reward_reference, tiny_model_dir, tmp_path
):
    out = tmp_path / "run"
    rc, text = run_cli(_reward(out, tiny_model_dir), tmp_path / "log0.txt", fault)
    if fault.startswith("kill"):
        assert rc == -signal.SIGKILL, text
    else:
        name = "SIGINT" if fault.startswith("int") else "SIGTERM"
        assert rc == 128 + getattr(signal, name), text
        assert _last(text) == (
            f"rloo reward: interrupted: {name} received; reward model stopped at step {stopped}/6 and saved "
            f"{out}/checkpoints/step-{saved:06d}; continue with the same command plus --resume"
        )
    rc, text = run_cli([*_reward(out, tiny_model_dir), "--resume"], tmp_path / "log1.txt")
    assert rc == 0, text
    assert f"at step {saved}" in text
    assert_same_params(reward_reference / "model", out / "model")
    assert json.loads((out / "accuracy.json").read_text()) == json.loads(
        (reward_reference / "accuracy.json").read_text()
    )
    ref = (reward_reference / "metrics.jsonl").read_text()
    assert (out / "metrics.jsonl").read_text() == ref, "each record written once, with the same values"


def test_resume_refuses_other_training_data(sft_reference, tmp_path):
    """A checkpoint's data position means nothing on other data: one line, exit 2, nothing changed."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(sft_reference, out)
    shutil.rmtree(out / "model")
    before = (out / "metrics.jsonl").read_bytes()
    argv = [*_sft(out), "num_examples=97", "--resume"]
    rc, text = run_cli(argv, tmp_path / "log.txt")
    assert rc == 2, text
    assert _last(text) == (
        "rloo sft: error: cannot resume: the training data differ from those this run was started with; "
        "use the same task settings, or --overwrite to start a new run"
    )
    assert (out / "metrics.jsonl").read_bytes() == before


# ---- rloo pipeline --resume -----------------------------------------------------------------

_TINY = {k: v for k, v in TINY_STUDY.items() if not k.startswith("variance")}
_TINY["rl"] = {k: v for k, v in _TINY["rl"].items() if k != "algorithm_settings"}  # compare's dpo cells'
PIPELINE = as_overrides(_TINY) + [
    "reward.save_every=1",  # records 1-2: SFT's steps, 3-4: the reward model's, then RL's
    "report_to=none",
]


def _pipeline(out: Path, *extra: str) -> list[str]:
    return ["pipeline", f"output_dir={out}", *PIPELINE, *extra]


def _sha(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pipeline_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipe") / "run"
    _finished(_pipeline(out), out.parent / "log.txt")
    return out


# term-log@3: SIGTERM after the reward model's step 1 (its checkpoint written by the stop); kill-log@4:
# SIGKILL after its step 2's record, before step 2's checkpoint (step 1's, save_every=1, is the newest)
@pytest.mark.parametrize("fault", [pytest.param("term-log@3", marks=pytest.mark.slow), "kill-log@4"])
def test_pipeline_stopped_in_the_reward_stage_resumes_to_the_same_models(fault, pipeline_reference, tmp_path):
    out = tmp_path / "run"
    rc, text = run_cli(_pipeline(out), tmp_path / "log0.txt", fault)
    if fault.startswith("term"):
        assert rc == 128 + signal.SIGTERM, text
        assert _last(text) == (
            f"rloo pipeline: interrupted: SIGTERM received; reward model stopped at step 1/2 and saved "
            f"{out}/reward/checkpoints/step-000001; continue with the same command plus --resume"
        )
    else:
        assert rc == -signal.SIGKILL, text
    sft_model = _sha(out / "sft" / "model")
    rc, text = run_cli([*_pipeline(out), "--resume"], tmp_path / "log1.txt")
    assert rc == 0, text
    assert f"finished in {out / 'sft'}: kept" in text
    assert f"resuming reward model from {out}/reward/checkpoints/step-000001 at step 1" in text
    assert _sha(out / "sft" / "model") == sft_model, "the finished SFT stage was not run again"
    for stage in ("sft", "reward", "rl"):
        assert _sha(out / stage / "model") == _sha(pipeline_reference / stage / "model"), stage
    summary, ref = (json.loads((d / "summary.json").read_text()) for d in (out, pipeline_reference))
    assert {k: v for k, v in summary.items() if k not in ("seconds", "plots")} == {
        k: v for k, v in ref.items() if k not in ("seconds", "plots")
    }


def test_a_moved_pipeline_keeps_its_finished_stages(pipeline_reference, tmp_path):
    """Issue 58: a finished pipeline copied elsewhere was refused on --resume ("the finished stage in
    .../reward was run with other settings (sft_model: '<old>/sft/model' -> '<new>/sft/model')"): the
    stages name each other's models by path. Paths inside the old folder now count as the new one's."""
    out = tmp_path / "moved" / "run"
    shutil.copytree(pipeline_reference, out)
    rc, text = run_cli([*_pipeline(out), "--resume"], tmp_path / "log.txt")
    assert rc == 0, text
    for stage in ("sft", "reward", "rl"):
        assert f"finished in {out / stage}: kept" in text, text
        assert _sha(out / stage / "model") == _sha(pipeline_reference / stage / "model"), stage


# DPO as the RL stage, on the reward model's 64 pairs in batches of 32: records 1-2 SFT's steps, 3-5 the
# reward model's (its held-out evaluation last), 6 DPO's evaluation at step 0, 7 its step 1
DPO_STAGE = ("rl.algorithm=dpo", "rl.algorithm_settings.dpo_batch_size=32")


@pytest.fixture(scope="module")
def dpo_pipeline_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipedpo") / "run"
    _finished(_pipeline(out, *DPO_STAGE), out.parent / "log.txt")
    return out


def test_pipeline_stopped_in_its_dpo_stage_continues_it(dpo_pipeline_reference, tmp_path):
    """SIGTERM after DPO's step 1 writes its checkpoint; --resume keeps SFT and the reward model and
    continues DPO at step 1 (before: nothing saved, and the DPO stage started over)."""
    out = tmp_path / "run"
    argv = _pipeline(out, *DPO_STAGE)
    rc, text = run_cli(argv, tmp_path / "log0.txt", "term-log@7")
    assert rc == 128 + signal.SIGTERM, text
    assert _last(text) == (
        f"rloo pipeline: interrupted: SIGTERM received; dpo stopped at step 1/2 and saved "
        f"{out}/rl/checkpoints/step-000001; continue with the same command plus --resume"
    )
    rc, text = run_cli([*argv, "--resume"], tmp_path / "log1.txt")
    assert rc == 0, text
    assert f"finished in {out / 'sft'}: kept" in text and f"finished in {out / 'reward'}: kept" in text
    assert f"resuming dpo from {out}/rl/checkpoints/step-000001 at step 1" in text
    for stage in ("sft", "reward", "rl"):
        assert _sha(out / stage / "model") == _sha(dpo_pipeline_reference / stage / "model"), stage
    assert (out / "rl" / "metrics.jsonl").read_text() == (dpo_pipeline_reference / "rl" / "metrics.jsonl").read_text()
    summary, ref = (json.loads((d / "summary.json").read_text()) for d in (out, dpo_pipeline_reference))
    assert {k: v for k, v in summary.items() if k not in ("seconds", "plots")} == {
        k: v for k, v in ref.items() if k not in ("seconds", "plots")
    }


def test_pipeline_resume_refuses_changed_settings(pipeline_reference, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(pipeline_reference, out)
    rc, text = run_cli([*_pipeline(out), "rl.steps=3", "--resume"], tmp_path / "log.txt")
    assert rc == 2, text
    assert _last(text) == (
        f"rloo pipeline: error: cannot resume the pipeline in {out} with changed settings (rl.steps: 2 -> 3); "
        "use its original settings, or pass --overwrite to start it over"
    )


def test_lora_sft_resumes_exactly_and_its_folder_can_be_overwritten(tiny_model_dir, tmp_path, monkeypatch):
    """LoRA: a checkpoint holds the adapters (PEFT's save_pretrained, with its README.md model card);
    the resume loads them into the stage's own adapters. `--overwrite` of such a folder was refused:
    the model card was not among the files rloo writes (rloo.runtime.runfolder.layout)."""
    import os

    import rloo.runtime.tracking.log as tracking
    from rloo.config import SFTConfig
    from rloo.errors import Interrupted
    from rloo.training.sft import sft

    torch.set_num_threads(1)  # bitwise: one thread (the suite's fixture sets the count back)
    lora = {"r": 4, "target_modules": "all-linear"}

    def cfg(out):
        return SFTConfig(
            output_dir=out, model=str(tiny_model_dir), num_examples=96, epochs=2, batch_size=32,
            save_every=2, lora=lora, report_to="none",
        )  # fmt: skip

    sft(cfg(tmp_path / "ref"))
    real, calls = tracking.MetricsLogger.log, [0]

    def log(self, step, metrics):
        real(self, step, metrics)
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(tracking.MetricsLogger, "log", log)
    with pytest.raises(Interrupted, match="sft stopped at step 3/6 and saved"):
        sft(cfg(tmp_path / "run"))
    monkeypatch.undo()
    assert (tmp_path / "run" / "checkpoints" / "step-000003" / "model" / "adapter_model.safetensors").exists()
    sft(cfg(tmp_path / "run"), resume=True)
    assert_same_params(tmp_path / "ref" / "model", tmp_path / "run" / "model")
    sft(cfg(tmp_path / "run"), overwrite=True)  # the checkpoints' adapter folders are rloo's own
    assert_same_params(tmp_path / "ref" / "model", tmp_path / "run" / "model")
