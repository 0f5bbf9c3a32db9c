"""The rollout producer on another machine (rl.producer_address, `rloo produce`; docs/async.md
"Across machines"), played by two processes on localhost over torch.distributed's Gloo link:
the run equals the in-process lag's bit for bit; SIGKILL of either side stops the other with one
line and no process left behind; a killed producer's run resumes exactly with a new one."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ._helpers import assert_same_params
from .test_async_processes import _metrics, _wait_for_steps

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
CLI = "import sys; from rloo.cli import main; sys.exit(main(sys.argv[1:]))"
ENV = os.environ | {"PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(log: Path, *argv) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLI, *argv], stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV)


def _trainer(tiny_model_dir, out: Path, address: str | None, *extra, steps=10, reward="slow_reward"):
    argv = [
        "train",
        f"policy={tiny_model_dir}",
        f"output_dir={out}",
        f"reward_fn=reliability.test_async_processes:{reward}",
        f"steps={steps}",
        "batch_size=2",
        "k=2",
        "max_new_tokens=5",
        "eval_every=null",
        "save_every=3",
        "max_staleness=2",
        *([f"producer_address={address}"] if address else []),
        *extra,
    ]
    return _run(out.parent / f"{out.name}-trainer.txt", *argv)


def _producer(log: Path, address: str, *extra) -> subprocess.Popen:
    return _run(log, "produce", f"address={address}", "threads=1", *extra)


def _last_line(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text and "frame #" not in text, text  # neither Python's nor c10d's
    return text.strip().splitlines()[-1]


@pytest.fixture
def reference(tiny_model_dir, tmp_path):
    """The same run with the lag simulated in the trainer's process (1 thread: LaggedSampler)."""
    out = tmp_path / "ref"
    assert _trainer(tiny_model_dir, out, None).wait(300) == 0, (tmp_path / "ref-trainer.txt").read_text()
    return out


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["full", "lora"])
def test_two_processes_on_localhost_equal_the_in_process_lag(tiny_model_dir, tmp_path, lora):
    """Every metric (sampled tokens' scores, KL, importance weights, lags) and the final weights
    bitwise: the producer sampled batch t with exactly the weights of update t - 2, received over
    the link (under LoRA: the adapters only)."""
    extra = ["lora.r=4", "lora.save=merged"] if lora else []
    ref = tmp_path / "ref"
    assert _trainer(tiny_model_dir, ref, None, *extra).wait(300) == 0, (tmp_path / "ref-trainer.txt").read_text()
    address = f"127.0.0.1:{_port()}"
    out = tmp_path / "run"
    trainer = _trainer(tiny_model_dir, out, address, *extra)
    producer = _producer(tmp_path / "producer.txt", address)
    try:
        assert trainer.wait(300) == 0, (tmp_path / "run-trainer.txt").read_text()
        assert producer.wait(60) == 0, (tmp_path / "producer.txt").read_text()
    finally:
        trainer.kill(), producer.kill()
    assert _last_line(tmp_path / "producer.txt") == "the trainer's run ended: stopping"
    records = _metrics(out)
    assert [r["is/lag"] for r in records if "is/lag" in r][:4] == [0, 1, 2, 2]
    assert records == _metrics(ref)
    assert_same_params(ref / "model", out / "model")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_stopped_trainer_stops_the_producer_with_one_line(tiny_model_dir, tmp_path, sig):
    """SIGKILL: the producer sees the link close at its next send or wait (within one batch) and
    exits 2; SIGTERM: the trainer checkpoints, tells the producer to stop, and both exit cleanly."""
    address = f"127.0.0.1:{_port()}"
    out = tmp_path / "run"
    trainer = _trainer(tiny_model_dir, out, address, steps=200)
    producer = _producer(tmp_path / "producer.txt", address)
    try:
        _wait_for_steps(out, trainer, 2)
        trainer.send_signal(sig)
        if sig == signal.SIGTERM:
            assert trainer.wait(120) == 128 + signal.SIGTERM
        assert producer.wait(60) == (2 if sig == signal.SIGKILL else 0)
    finally:
        trainer.kill(), producer.kill()
    went = f"rloo produce: error: the trainer at {address} went away (the connection was closed by the other side)"
    ended = "the trainer's run ended: stopping"
    assert _last_line(tmp_path / "producer.txt") == (went if sig == signal.SIGKILL else ended)


def test_sigkill_of_the_producer_stops_the_trainer_and_resume_with_a_new_one_is_exact(
    tiny_model_dir, tmp_path, reference
):
    address = f"127.0.0.1:{_port()}"
    out = tmp_path / "run"
    trainer = _trainer(tiny_model_dir, out, address)
    producer = _producer(tmp_path / "producer.txt", address)
    try:
        _wait_for_steps(out, trainer, 4)  # past the checkpoint at step 3
        producer.send_signal(signal.SIGKILL)
        assert trainer.wait(60) == 2
    finally:
        trainer.kill(), producer.kill()
    last = _last_line(tmp_path / "run-trainer.txt")
    assert last.startswith(f"rloo train: error: the rollout producer at {address} went away (")
    assert "rerun with --resume" in last
    (tmp_path / "run-trainer.txt").rename(tmp_path / "stopped-trainer.txt")
    resumed = _trainer(tiny_model_dir, out, address, "--resume")
    second = _producer(tmp_path / "producer-2.txt", address)
    try:
        assert resumed.wait(300) == 0, (tmp_path / "run-trainer.txt").read_text()
        assert second.wait(60) == 0, (tmp_path / "producer-2.txt").read_text()
    finally:
        resumed.kill(), second.kill()
    step = re.search(r"resuming from \S+ at step (\d+)", (tmp_path / "run-trainer.txt").read_text())[1]
    assert int(step) >= 3 and f"sampling from batch {step} " in (tmp_path / "producer-2.txt").read_text()
    assert _metrics(out) == _metrics(reference)  # the checkpoint's older versions went to the new producer
    assert_same_params(reference / "model", out / "model")


def test_a_producer_with_no_trainer_says_so_in_one_line(tmp_path):
    log = tmp_path / "producer.txt"
    assert _producer(log, f"127.0.0.1:{_port()}", "connect_timeout_s=1").wait(60) == 2
    assert _last_line(log).startswith("rloo produce: error: the trainer at 127.0.0.1:")


def test_a_trainer_whose_port_is_taken_says_so_in_one_line(tiny_model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert _trainer(tiny_model_dir, tmp_path / "run", address).wait(120) == 2
    port = address.rsplit(":", 1)[1]
    assert _last_line(tmp_path / "run-trainer.txt") == (
        f"rloo train: error: producer_address={address}: port {port} is in use on this machine; choose another port"
    )
    assert not (tmp_path / "run").exists()  # refused before anything is written
