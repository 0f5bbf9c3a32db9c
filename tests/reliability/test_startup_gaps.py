"""Round five (issue 58): the start-up gaps and round four's leftovers. A plugin that calls
os._exit, a model folder without a tokenizer, a signal while the command starts (or one Python
drops inside a finalizer), SIGHUP, `--resume` of a folder that does not exist or of a finished run
without checkpoints, stdout block-buffered into a log file, and the lock file a finished `rloo
compare` left behind: each one line, and nothing written or changed where it is a refusal."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from rloo.cli import main
from rloo.config import RLConfig, describe_fields
from rloo.errors import StopNow
from rloo.runtime.checkpoint.verify import list_checkpoints, step_of, verify_checkpoint
from rloo.runtime.runfolder.lock import LOCK_NAME
from rloo.runtime.runfolder.sharedlock import SharedFolder
from rloo.runtime.signals import signals_stop_now

from ._runner import run_cli
from .test_bad_input import TINY_RUN, _files, _one_line
from .test_bad_input_table import RW, _tree


def _train(model, out, *extra) -> list[str]:
    return ["train", f"policy={model}", RW, *TINY_RUN, f"output_dir={out}", *extra]


# -- a plugin that calls os._exit ----------------------------------------------------------------


def test_a_plugin_calling_os_exit_is_one_line(tiny_model_dir, tmp_path):
    """It ended `rloo train` with exit 0, no output and nothing trained (in a child: on the old code
    the call ends the process that runs it)."""
    plugin = tmp_path / "quits.py"
    plugin.write_text("import os\nos._exit(0)\n")
    out = tmp_path / "run"
    rc, text = run_cli([*_train(tiny_model_dir, out), "--plugin", str(plugin)], tmp_path / "log.txt")
    _one_line(rc, text.strip(), f"rloo train: error: plugin '{plugin}' called os._exit(0) while loading")
    assert not out.exists()


def test_a_process_the_plugin_forks_may_still_os_exit(tiny_model_dir, tmp_path):
    """Only the loading process's own os._exit is refused: a child the plugin forks ends as it asks
    (the plugin's assert would fail otherwise); the command goes on to its config."""
    plugin = tmp_path / "forks.py"
    plugin.write_text(
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
        "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
    )
    out = tmp_path / "run"
    rc, text = run_cli([*_train(tiny_model_dir, out, "bogus=1"), "--plugin", str(plugin)], tmp_path / "log.txt")
    _one_line(rc, text.strip(), "rloo train: error: invalid config: unknown key 'bogus'")


# -- a model folder without a tokenizer ------------------------------------------------------------


@pytest.mark.parametrize(
    "command, key", [("train", "policy"), ("sft", "model"), ("pipeline", "model"), ("eval", "policy")]
)
def test_a_model_folder_without_a_tokenizer_is_refused_up_front(command, key, tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "in" / "notok"
    shutil.copytree(tiny_model_dir, model)
    for f in model.glob("tokenizer*"):
        f.unlink()
    args = [f"{key}={model}", *([RW] if command == "train" else [])]
    before = _tree(tmp_path)
    t = time.perf_counter()
    rc = main([command, *args, f"output_dir={tmp_path / 'out'}"])
    _one_line(rc, capsys.readouterr().err.strip(), f"rloo {command}: error: {key} '{model}' holds no tokenizer")
    assert _tree(tmp_path) == before, "nothing is created"
    assert time.perf_counter() - t < 3, "refused before any model loads"


# -- signals while the command starts, or dropped by Python --------------------------------------


class _SignalsWhenCollected:
    """Sends SIGTERM to this process from its finalizer: the handler runs inside __del__, where
    Python drops what it raises ("Exception ignored in ... __del__") and the run went on."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_dropped_inside_a_finalizer_is_raised_again():
    with pytest.raises(StopNow) as stopped, signals_stop_now():
        _SignalsWhenCollected()  # collected at once
        t = time.monotonic()
        while time.monotonic() - t < 5:  # the signal comes again within RESEND_AFTER_S
            time.sleep(0.01)
    assert stopped.value.exit_code == 128 + signal.SIGTERM


def test_sigterm_while_a_plugin_loads_is_one_line(tiny_model_dir, tmp_path):
    """Before any stage: Python's default for SIGTERM ended the command without a word."""
    plugin = tmp_path / "slow.py"
    plugin.write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n")
    out = tmp_path / "run"
    rc, text = run_cli([*_train(tiny_model_dir, out), "--plugin", str(plugin)], tmp_path / "log.txt")
    assert rc == 128 + signal.SIGTERM, text
    assert text.strip() == "rloo train: interrupted by SIGTERM; nothing was written; rerun the same command"
    assert not out.exists()


def test_sighup_stops_a_run_as_sigterm_does(tiny_model_dir, tmp_path):
    """A closed terminal or ssh session ended the run silently; now a checkpoint and one line."""
    out = tmp_path / "run"
    rc, text = run_cli(_train(tiny_model_dir, out, "save_every=null"), tmp_path / "log.txt", "hup@1")
    assert rc == 128 + signal.SIGHUP, text
    assert text.strip().splitlines()[-1] == (
        f"rloo train: interrupted: SIGHUP received; stopped at step 1/2 and saved {out}/checkpoints/step-000001; "
        "continue with the same command plus --resume"
    )
    assert [step_of(c) for c in list_checkpoints(out)] == [1]
    assert verify_checkpoint(out / "checkpoints" / "step-000001") is None


# -- --resume with nothing to resume -------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "sft", "pipeline"])
def test_resume_of_a_folder_that_does_not_exist_is_refused(command, tiny_model_dir, tmp_path, capsys):
    """A typo in output_dir started a fresh full run."""
    out = tmp_path / "typo"
    args = _train(tiny_model_dir, out)[1:] if command == "train" else [f"output_dir={out}"]
    rc = main([command, *args, "--resume"])
    needle = f"rloo {command}: error: nothing to resume: {out} does not exist; check output_dir, or drop --resume"
    _one_line(rc, capsys.readouterr().err.strip(), needle)
    assert not out.exists()


def test_resume_of_an_empty_folder_is_refused(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    rc = main([*_train(tiny_model_dir, out), "--resume"])
    _one_line(rc, capsys.readouterr().err.strip(), f"nothing to resume: {out} holds no run")
    assert list(out.iterdir()) == []


def test_resume_of_a_finished_run_without_checkpoints_changes_nothing(tiny_model_dir, tmp_path, capsys):
    """It trained the run again and rewrote its model/, exit 0."""
    out = tmp_path / "run"
    assert main(_train(tiny_model_dir, out, "save_every=null")) == 0
    capsys.readouterr()
    before = _files(out)
    rc = main([*_train(tiny_model_dir, out, "save_every=null"), "--resume"])
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"nothing to resume: {out} holds a finished train run (its model: {out}/model) and no checkpoint",
        "pass --overwrite",
    )
    assert _files(out) == before


# -- stdout into a file, and the lock of a finished comparison -----------------------------------


def test_stdout_into_a_file_is_line_buffered(tmp_path, monkeypatch):
    """What the command prints to stdout (here `--help-config`; a plugin's or a reward function's
    prints alike) is in the file as soon as it is printed: block-buffered, a killed run lost up to
    8 KiB of it. (A file of this test's own, not the process's stdout, which PYTHONUNBUFFERED may
    have made unbuffered already.)"""
    log = tmp_path / "stdout.txt"
    with open(log, "w") as stdout:  # a file: block-buffered, as Python makes sys.stdout for one
        assert not stdout.line_buffering
        monkeypatch.setattr("sys.stdout", stdout)
        assert main(["train", "--help-config"]) == 0
        written = log.read_text()  # before the file is flushed or closed
    assert written == "\n".join(describe_fields(RLConfig)) + "\n"


def test_the_last_process_of_a_study_removes_its_lock_file(tmp_path):
    first = SharedFolder(tmp_path, overwrite=False)
    first.share()
    second = SharedFolder(tmp_path, overwrite=False)  # joins
    first.close()
    assert (tmp_path / LOCK_NAME).exists(), "the second still holds it"
    second.close()
    assert not (tmp_path / LOCK_NAME).exists()
    again = SharedFolder(tmp_path, overwrite=False)  # a later study takes the folder afresh
    assert again.exclusive
    again.close()


def test_a_finished_comparison_leaves_no_lock_file(tiny_study):
    assert (tiny_study / "report").is_dir()
    assert not (tiny_study / LOCK_NAME).exists()
