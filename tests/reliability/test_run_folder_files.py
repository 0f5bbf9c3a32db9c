"""Round five (issue 58): what a command reads or appends to in a run folder is a regular file of its
own, or the command stops at once with one line (exit 2) and changes nothing.

Before: a FIFO at `metrics.jsonl`, `config.yaml` or a checkpoint's `COMPLETE` hung `--resume`
forever (only `.rloo.lock` was guarded); `plots` as a file or FIFO passed the start-up check, so
the run trained and then failed with a generic FileExistsError; a `metrics.jsonl` hard-linked to a
file elsewhere was cut back and appended to through the link; `model.safetensors` was written 0o600
whatever the umask (safetensors' own mode), so others sharing the run folder could not load it."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.runtime.runfolder.atomic import WriteError, open_append, truncate_file
from rloo.runtime.runfolder.reading import NotARegularFile, check_regular, read_text

from ._runner import run_cli
from .conftest import TRAIN
from .test_bad_input import _files, _one_line

RESUME3 = [a if not a.startswith("steps=") else "steps=3" for a in TRAIN]


@contextmanager
def deadline(seconds: float):
    """Fail (TimeoutError) instead of hanging when the code under test blocks, e.g. opening a FIFO."""

    def _expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds}s (a FIFO opened and waited on?)")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _resume(out: Path, model: Path, capsys) -> tuple[int, str]:
    with deadline(60):
        rc = main(["train", f"policy={model}", f"output_dir={out}", *RESUME3, "--resume"])
    return rc, capsys.readouterr().err.strip()


def _plant(out: Path, rel: str, kind: str) -> Path:
    target = out / rel
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text("not a folder\n")
    return target


@pytest.mark.parametrize(
    "rel, kind, needle",
    [
        ("metrics.jsonl", "fifo", "is a FIFO (named pipe), not a regular file"),
        ("config.yaml", "fifo", "is a FIFO (named pipe), not a regular file"),
        ("checkpoints/step-000002/COMPLETE", "fifo", "is a FIFO (named pipe), not a regular file"),
        ("plots", "fifo", "is a FIFO (named pipe) where rloo keeps a folder of its own"),
        ("plots", "file", "is a file where rloo keeps a folder of its own"),
    ],
    ids=["metrics-fifo", "config-fifo", "complete-fifo", "plots-fifo", "plots-file"],
)
def test_resume_refuses_a_fifo_or_file_planted_in_the_run_folder(
    rel, kind, needle, train_run, tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    shutil.copytree(train_run, out, symlinks=True)
    planted = _plant(out, rel, kind)
    before = _files(out)
    rc, err = _resume(out, tiny_model_dir, capsys)
    _one_line(rc, err, "rloo train: error: ", str(planted), needle)
    assert _files(out) == before, "the run folder was changed"
    assert not (out / "checkpoints" / "step-000003").exists()


def test_resume_never_cuts_or_appends_to_a_hard_linked_metrics_file(train_run, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(train_run, out, symlinks=True)
    victim = tmp_path / "notes.jsonl"
    os.link(out / "metrics.jsonl", victim)
    with open(victim, "a") as fh:  # past the checkpoint's metrics_bytes: a resume would cut it
        fh.write('{"a user": "line"}\n')
    data, before = victim.read_bytes(), _files(out)
    rc, err = _resume(out, tiny_model_dir, capsys)
    assert victim.read_bytes() == data, "the hard-linked file was changed"
    assert _files(out) == before, "the run folder was changed"
    _one_line(rc, err, "metrics.jsonl: it is hard-linked (2 names)")


def test_reads_and_appends_refuse_fifos_devices_and_links_without_blocking(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    with deadline(10):
        with pytest.raises(NotARegularFile, match=r"metrics\.jsonl is a FIFO \(named pipe\), not a regular file"):
            read_text(fifo)
        with pytest.raises(NotARegularFile, match="is a FIFO"):
            open_append(fifo)  # no reader: the non-blocking open fails with ENXIO
        with pytest.raises(NotARegularFile, match="is a FIFO"):
            truncate_file(fifo, 0)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # with a reader the open succeeds: fstat refuses
        try:
            with pytest.raises(NotARegularFile, match="is a FIFO"):
                open_append(fifo)
        finally:
            os.close(reader)
    device = tmp_path / "zero"
    device.symlink_to("/dev/zero")
    with deadline(10), pytest.raises(NotARegularFile, match="is a symbolic link"):
        read_text(device)  # through the link: /dev/zero would read without end
    with pytest.raises(NotARegularFile, match="is a character device"):
        read_text("/dev/zero")
    with pytest.raises(NotARegularFile, match="is a symbolic link"):
        check_regular(device)
    plain = tmp_path / "plain.txt"
    plain.write_text("ok\n")
    assert read_text(plain) == "ok\n"
    check_regular(plain)
    check_regular(tmp_path / "missing")  # a missing file is the caller's concern
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing")
    os.link(plain, tmp_path / "other-name")
    with pytest.raises(WriteError, match="hard-linked"):
        open_append(plain)
    assert plain.read_text() == "ok\n"


def test_saved_models_are_readable_as_the_umask_allows(tiny_model_dir, tmp_path, capsys):
    """Every file of the final model and of each checkpoint has the mode a plain open gives under
    umask 022 (0o644), not safetensors' 0o600; and 0o600 under umask 077 (the umask is honoured)."""
    for mask, expected in ((0o022, 0o644), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            out = tmp_path / f"run-{mask:o}"
            assert main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN]) == 0
        finally:
            os.umask(old)
        files = [p for p in out.rglob("*") if p.is_file() and p.name != ".rloo.lock"]
        modes = {str(p.relative_to(out)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
        assert "model/model.safetensors" in modes and "checkpoints/step-000002/model/model.safetensors" in modes
        wrong = {k: v for k, v in modes.items() if v != oct(expected)}
        assert not wrong, f"umask {mask:o}: expected {oct(expected)}, got {wrong}"
    capsys.readouterr()


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "model.safetensors"])
@pytest.mark.parametrize("command, key", [("train", "policy"), ("sft", "model"), ("eval", "policy")])
def test_a_fifo_in_a_model_folder_is_refused_not_waited_on(command, key, name, tiny_model_dir, tmp_path):
    """A model folder is the user's input, not a run folder, but a FIFO there hung every command
    forever (config.json: the up-front size check read it; found retrying break 5 from the CLI) or
    was called an empty weights file. Links into a Hugging Face cache stay allowed (followed)."""
    model = tmp_path / "in" / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / name).unlink()
    os.mkfifo(model / name)
    out = tmp_path / "out"
    extra = ["reward_fn=reliability._helpers:reward_short"] if command == "train" else []
    # in a child, killed after 60 s: `deadline`'s TimeoutError is an OSError, which a reader that
    # takes OSError for "no such file" swallowed before opening the FIFO again
    rc, text = run_cli([command, f"{key}={model}", *extra, f"output_dir={out}"], tmp_path / "log.txt", timeout=60)
    _one_line(rc, text.strip(), f"rloo {command}: error: {key} '{model}': {name} is a FIFO")
    assert not out.exists()
