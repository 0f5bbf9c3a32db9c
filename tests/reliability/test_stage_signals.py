"""SIGTERM during an SFT or reward-model stage or during an RL run under `rloo compare`: one line
that says what stopped, what was saved and how to continue, exit code 143 (128 + SIGTERM), as
`rloo train`'s own interrupt (tests/reliability/test_kill.py). Before these, SIGTERM in an SFT or
reward-model stage ended the process with no line at all (Python's default for SIGTERM). Resuming
those stages bit for bit: tests/reliability/test_stage_resume.py."""

from __future__ import annotations

import signal
from pathlib import Path

from rloo.config import save_config

from ._runner import run_cli
from .conftest import tiny_study_config

TERM = 128 + signal.SIGTERM
STUDY = "rerun the same command to continue the study (finished runs are kept; unfinished ones start over)"
TINY_SFT = [
    "num_examples=64",
    "epochs=1",
    "batch_size=32",
    "arch.hidden_size=32",
    "arch.num_layers=1",
    "arch.num_heads=2",
    "arch.intermediate_size=64",
]


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_sigterm_in_rloo_sft_saves_and_says_resume(tmp_path):
    out = tmp_path / "sft"
    argv = ["sft", f"output_dir={out}", *TINY_SFT]
    rc, text = run_cli(argv, tmp_path / "log.txt", "term-log@1")  # after the first of its 2 steps
    assert rc == TERM, text
    assert _last_line(text) == (
        f"rloo sft: interrupted: SIGTERM received; sft stopped at step 1/2 and saved {out}/checkpoints/step-000001; "
        "continue with the same command plus --resume"
    ), text
    assert not (out / "model").exists()
    rc, text = run_cli([*argv, "--resume"], tmp_path / "log2.txt")  # what the line says works
    assert rc == 0 and (out / "model").is_dir(), text
    assert f"resuming sft from {out}/checkpoints/step-000001 at step 1" in text


def _study(tmp_path: Path) -> list[str]:
    path = tmp_path / "study.yaml"
    save_config(tiny_study_config(tmp_path / "cmp"), path)
    return ["compare", "--config", str(path)]


def test_sigterm_in_compare_stages_says_rerun(tmp_path):
    """Records 1-2 are the cell's SFT steps, 3-4 its reward model's (tiny_study_config: 2 steps each)."""
    argv = _study(tmp_path)
    rc, text = run_cli(argv, tmp_path / "sft.txt", "term-log@1")
    assert rc == TERM, text
    assert _last_line(text) == f"rloo compare: interrupted: SIGTERM received; sft stopped at step 1/2; {STUDY}", text
    rc, text = run_cli(argv, tmp_path / "reward.txt", "term-log@3")  # the rerun: SFT again, then 1 RM step
    assert rc == TERM, text
    assert _last_line(text) == (
        f"rloo compare: interrupted: SIGTERM received; reward model stopped at step 1/2; {STUDY}"
    ), text
    assert not list((tmp_path / "cmp").rglob("checkpoints/step-*")), "a study reruns its stages: nothing to save"


def test_sigterm_in_rl_run_of_compare_says_rerun_not_resume(tmp_path):
    """`rloo compare` has no --resume: a rerun starts the unfinished run over (run_cell trains it with
    overwrite=True), so no checkpoint is written either."""
    argv = _study(tmp_path)
    rc, text = run_cli(argv, tmp_path / "rl.txt", "term@1")
    assert rc == TERM, text
    assert _last_line(text) == f"rloo compare: interrupted: SIGTERM received; stopped at step 1/2; {STUDY}", text
    assert not list((tmp_path / "cmp").rglob("checkpoints/step-*"))


def test_sigterm_after_the_last_step_stops_the_study(tmp_path):
    """Record 5 is the reward model's held-out evaluation, after its last step (records 1-2: SFT,
    3-4: its steps); in the rerun, whose SFT model is there, record 8 is the RL run's final
    evaluation (records 1-3: the reward model again, 4-8: evals at steps 0, 1, 2 and the stats of
    steps 1, 2). A
    standalone stage finishes then (quicker than a rerun); a study must not go on to its next run
    as if no signal had come (before: the study finished, exit 0)."""
    argv = _study(tmp_path)
    rc, text = run_cli(argv, tmp_path / "rm-eval.txt", "term-log@5")
    assert rc == TERM, text
    assert _last_line(text) == (
        f"rloo compare: interrupted: SIGTERM received; reward model stopped at step 2/2; {STUDY}"
    ), text
    rc, text = run_cli(argv, tmp_path / "rl-eval.txt", "term-log@8")
    assert rc == TERM, text
    assert _last_line(text) == f"rloo compare: interrupted by SIGTERM; {STUDY}", text
    assert not (tmp_path / "cmp" / "runs" / "summarize" / "seed-0" / "rloo" / "result.json").exists()


def test_sigterm_outside_a_training_step_is_one_line(monkeypatch, tmp_path, capsys):
    """SIGTERM while a command loads, judges or sits between runs stops at once, as SIGINT does,
    with the line and 143: before, Python's default for SIGTERM ended the process without a word.
    (This test's own handler stands in for that default, so that the old code fails it, not kills it.)"""
    import os
    import time

    import rloo.cli as cli

    def run(cfg, args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setitem(cli.COMMANDS, "compare", (cli.COMMANDS["compare"][0], run))
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        rc = cli.main(["compare", f"output_dir={tmp_path / 'cmp'}"])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert rc == TERM
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"rloo compare: interrupted by SIGTERM; {STUDY}"


def test_a_stop_at_once_says_how_each_command_continues(tmp_path):
    """The CLI's line for a stop outside a training step: --resume where a checkpoint can be read
    back (`rloo train` of every method, dpo included, sft, reward, pipeline) once the run folder
    holds the run, not for eval (before, dpo, which had no checkpoints, said --overwrite); before
    anything was written (the config not read yet, or no run folder), the same command again:
    --resume is refused there (rloo.training.resumable)."""
    from rloo.cli import _stopped_at_once
    from rloo.config import PipelineConfig, RLConfig, SFTConfig
    from rloo.runtime.runfolder.layout import write_marker

    overwrite = "rerun the same command with --overwrite to start it over"
    resume = "rerun with --resume to continue from the newest checkpoint (step 0 if none)"
    fresh = "nothing was written; rerun the same command"
    started = tmp_path / "started"
    started.mkdir()
    write_marker(started, "train")
    rl = RLConfig(policy="p", output_dir=started)
    assert _stopped_at_once("train", rl, 130) == f"interrupted by SIGINT; {resume}"
    dpo = RLConfig(policy="p", algorithm="dpo", output_dir=started)
    assert _stopped_at_once("train", dpo, 143) == f"interrupted by SIGTERM; {resume}"
    assert _stopped_at_once("eval", None, 143) == f"interrupted by SIGTERM; {overwrite}"
    assert _stopped_at_once("pipeline", PipelineConfig(output_dir=started), 143) == (
        "interrupted by SIGTERM; continue with the same command plus --resume"
    )
    for stage in ("sft", "reward", "pipeline", "train"):
        assert _stopped_at_once(stage, None, 130) == f"interrupted by SIGINT; {fresh}"
    assert _stopped_at_once("sft", SFTConfig(output_dir=tmp_path / "none"), 143) == f"interrupted by SIGTERM; {fresh}"
    assert _stopped_at_once("compare", None, 143) == f"interrupted by SIGTERM; {STUDY}"


def test_a_failed_step_under_compare_says_rerun_not_resume(tmp_path):
    """A step that raised (a reward error, ...) under `rloo compare` named --resume, which compare
    does not have; its rerun starts the run over, so nothing is saved either."""
    from rloo.errors import RewardError, cli_options, rerun_continues, study_rerun
    from rloo.training.loop import _failed_step

    class Checkpointer:
        skip_note, saved = None, []

        def save(self, state):
            self.saved.append(state)
            return tmp_path / "step-000002"

    ck = Checkpointer()
    with cli_options():
        with rerun_continues(study_rerun()):
            in_study = str(_failed_step(ck, {}, 3, RewardError("bad score")))
        assert in_study == f"bad score (at step 3; fix the cause and {STUDY})" and not ck.saved
        alone = str(_failed_step(ck, {}, 3, RewardError("bad score")))
    assert alone.endswith("fix the cause and rerun with --resume)") and len(ck.saved) == 1
