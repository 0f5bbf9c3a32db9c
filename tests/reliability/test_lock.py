"""One process per run folder (rloo.runtime.runfolder.lock): a second process on a folder in use gets one line
naming the holder's PID within 2 s; the run that holds it finishes whole; a lock left by a killed
process is taken over. Every test here runs two or more real processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.experiments.compare.folder import claim as _claim
from rloo.runtime.checkpoint.verify import list_checkpoints, verify_checkpoint

from ._helpers import hold_lock, metric_steps
from ._runner import _context, start_cli

RUN = [
    "reward_fn=reliability._helpers:reward_short",
    "steps=6",
    "batch_size=2",
    "k=2",
    "max_new_tokens=5",
    "lr=3e-3",
    "warmup_steps=2",
    "save_every=2",
    "keep_checkpoints=2",
    "eval_every=null",
    "log_every=1",
]


def _wait_for(path: Path, proc, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.is_alive(), f"the process exited ({proc.exitcode}) before {path} appeared"
        assert time.monotonic() - t0 < timeout, f"{path} did not appear"
        time.sleep(0.05)


def _error_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if "error:" in x or "Traceback" in x]


def test_second_process_on_a_running_folder_is_refused(tiny_model_dir, tmp_path):
    out, argv = tmp_path / "run", ["train", f"policy={tiny_model_dir}", f"output_dir={tmp_path / 'run'}", *RUN]
    first = start_cli(argv, tmp_path / "first.log", fault="pause@3")
    _wait_for(tmp_path / "first.log.paused", first)  # the first run is inside step 3
    config_before = (out / "config.yaml").read_bytes()
    t0 = time.monotonic()
    second = start_cli([*argv, "--resume"], tmp_path / "second.log")
    second.join(60)
    took = time.monotonic() - t0
    text = (tmp_path / "second.log").read_text()
    assert second.exitcode == 2, text
    assert _error_lines(text) == text.strip().splitlines(), text  # nothing but the one error line
    assert len(_error_lines(text)) == 1 and f"is in use by process {first.pid} on " in text, text
    assert took < 2.0, f"the refusal took {took:.2f}s"
    first.join(300)
    assert first.exitcode == 0, (tmp_path / "first.log").read_text()
    assert metric_steps(out) == [1, 2, 3, 4, 5, 6], "the first run's metrics are complete and in order"
    assert (out / "config.yaml").read_bytes() == config_before
    assert all(verify_checkpoint(c) is None for c in list_checkpoints(out)) and (out / "model").exists()
    assert not (out / ".rloo.lock").exists()


def test_eight_simultaneous_fresh_starts_give_one_run_and_clear_refusals(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    argv = ["train", f"policy={tiny_model_dir}", f"output_dir={out}", *RUN, "steps=2", "save_every=1"]
    # writing config.yaml is slowed down, so that the others surely meet a half-made folder
    procs = [start_cli(argv, tmp_path / f"p{i}.log", fault="slow-config@0") for i in range(8)]
    for p in procs:
        p.join(300)
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(8)]
    winners = [i for i, p in enumerate(procs) if p.exitcode == 0]
    assert len(winners) == 1, [p.exitcode for p in procs]
    pid = procs[winners[0]].pid
    for i, (p, text) in enumerate(zip(procs, logs, strict=False)):
        if i in winners:
            continue
        assert p.exitcode == 2, text
        lines = _error_lines(text)
        assert len(lines) == 1 and lines == text.strip().splitlines()[-1:], text
        assert re.search(rf"is in use by process {pid} on |already holds this run; pass --resume", lines[0]), text
    assert metric_steps(out) == [1, 2]


def _holder(folder: Path, tmp_path: Path, seconds: float = 60, die: bool = False):
    ready = tmp_path / f"ready-{folder.name}"
    proc = _context().Process(target=hold_lock, args=(str(folder), str(ready), seconds, die))
    proc.start()
    if die:
        proc.join(30)
    else:
        _wait_for(ready, proc)
    return proc


@pytest.mark.parametrize(
    "command, args",
    [
        ("sft", ["epochs=1", "num_examples=8"]),
        ("reward", ["sft_model={model}", "num_pairs=8", "eval_pairs=2"]),
        ("eval", ["policy={model}", "num_prompts=2"]),
        ("pipeline", []),
        ("train", ["policy={model}", "reward_fn=reliability._helpers:reward_short"]),
    ],
)
def test_every_stage_refuses_a_folder_in_use(command, args, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "busy"
    holder = _holder(out, tmp_path)
    try:
        t0 = time.monotonic()
        rc = main([command, f"output_dir={out}", *[a.format(model=tiny_model_dir) for a in args]])
        took = time.monotonic() - t0
        err = capsys.readouterr().err.strip()
    finally:
        holder.kill()
        holder.join()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"rloo {command}: error: {out} is in use by process {holder.pid} on " in err, err
    assert took < 2.0, f"the refusal took {took:.2f}s"


def test_compare_leaves_a_cell_in_use_to_its_holder(tmp_path, capsys):
    cell = tmp_path / "runs" / "summarize" / "seed-0"
    holder = _holder(cell, tmp_path)
    try:
        with _claim(cell) as mine:
            assert not mine
        assert f"is in use by process {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.join()
    with _claim(cell) as mine:  # its holder is gone: the cell is free
        assert mine


def test_lock_of_a_killed_process_is_taken_over(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    dead = _holder(out, tmp_path, die=True)
    assert dead.exitcode == -9 and (out / ".rloo.lock").exists()
    rc = main(["eval", f"policy={tiny_model_dir}", f"output_dir={out}", "num_prompts=2"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"took over the lock of process {dead.pid} on " in err and "no longer running" in err
    assert (out / "eval.json").exists() or any(out.iterdir())
    assert not (out / ".rloo.lock").exists()
