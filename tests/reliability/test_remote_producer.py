"""The rollout producer on another machine (rl.producer_address, `rloo produce`; docs/async.md
"Across machines"), played by two processes on localhost over torch.distributed's Gloo link:
the run equals the in-process lag's bit for bit; SIGKILL of either side stops the other with one
line and no process left behind; a killed producer's run resumes exactly with a new one."""

from __future__ import annotations

import re
import signal
import socket

import pytest

from ._helpers import assert_same_params
from ._procs import free_port, last_line, metrics, remote_producer, remote_trainer, wait_for_steps


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """The same run with the lag simulated in the trainer's process (1 thread: LaggedSampler); read-only."""
    out = tmp_path_factory.mktemp("remote-ref") / "ref"
    assert remote_trainer(tiny_model_dir, out, None).wait(300) == 0, (out.parent / "ref-trainer.txt").read_text()
    return out


VARIANTS = {"full": [], "lora": ["lora.r=4", "lora.save=merged"], "bf16": ["dtype=bfloat16"]}


SLOW = pytest.mark.slow  # the full case runs the same link and job (docs/testing.md)


@pytest.mark.parametrize("variant", ["full", pytest.param("lora", marks=SLOW), pytest.param("bf16", marks=SLOW)])
def test_two_processes_on_localhost_equal_the_in_process_lag(tiny_model_dir, tmp_path, variant, request):
    """Every metric (sampled tokens' scores, KL, importance weights, lags) and the final weights
    bitwise: the producer sampled batch t with exactly the weights of update t - 2, received over
    the link (under LoRA: the adapters only), in the trainer's precision (bf16: the stage's autocast,
    which the producer's machine enters from the job it receives)."""
    extra = VARIANTS[variant]
    if extra:
        ref = tmp_path / "ref"
        assert remote_trainer(tiny_model_dir, ref, None, *extra).wait(300) == 0, (
            tmp_path / "ref-trainer.txt"
        ).read_text()
    else:  # the module's never-stopped run, which the resume test reads too
        ref = request.getfixturevalue("reference")
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    trainer = remote_trainer(tiny_model_dir, out, address, *extra)
    producer = remote_producer(tmp_path / "producer.txt", address)
    try:
        assert trainer.wait(300) == 0, (tmp_path / "run-trainer.txt").read_text()
        assert producer.wait(60) == 0, (tmp_path / "producer.txt").read_text()
    finally:
        trainer.kill(), producer.kill()
    assert last_line(tmp_path / "producer.txt") == "the trainer's run ended: stopping"
    records = metrics(out)
    assert [r["is/lag"] for r in records if "is/lag" in r][:4] == [0, 1, 2, 2]
    assert records == metrics(ref)
    assert_same_params(ref / "model", out / "model")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_stopped_trainer_stops_the_producer_with_one_line(tiny_model_dir, tmp_path, sig):
    """SIGKILL: the producer sees the link close at its next send or wait (within one batch) and
    exits 2; SIGTERM: the trainer checkpoints, tells the producer to stop, and both exit cleanly."""
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    trainer = remote_trainer(tiny_model_dir, out, address, steps=200)
    producer = remote_producer(tmp_path / "producer.txt", address)
    try:
        wait_for_steps(out, trainer, 2)
        trainer.send_signal(sig)
        if sig == signal.SIGTERM:
            assert trainer.wait(120) == 128 + signal.SIGTERM
        assert producer.wait(60) == (2 if sig == signal.SIGKILL else 0)
    finally:
        trainer.kill(), producer.kill()
    # the kernel closes a killed process's socket with FIN, or with RST where data sent to it was unread
    # (seen on a loaded machine): rloo.runtime.link.gloo names either
    went = [
        f"rloo produce: error: the trainer at {address} went away (the connection was {how})"
        for how in ("closed by the other side", "reset")
    ]
    ended = ["the trainer's run ended: stopping"]
    assert last_line(tmp_path / "producer.txt") in (went if sig == signal.SIGKILL else ended)


def test_sigkill_of_the_producer_stops_the_trainer_and_resume_with_a_new_one_is_exact(
    tiny_model_dir, tmp_path, reference
):
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    trainer = remote_trainer(tiny_model_dir, out, address)
    producer = remote_producer(tmp_path / "producer.txt", address)
    try:
        wait_for_steps(out, trainer, 4)  # past the checkpoint at step 3
        producer.send_signal(signal.SIGKILL)
        assert trainer.wait(60) == 2
    finally:
        trainer.kill(), producer.kill()
    last = last_line(tmp_path / "run-trainer.txt")
    assert last.startswith(f"rloo train: error: the rollout producer at {address} went away (")
    assert "rerun with --resume" in last
    (tmp_path / "run-trainer.txt").rename(tmp_path / "stopped-trainer.txt")
    resumed = remote_trainer(tiny_model_dir, out, address, "--resume")
    second = remote_producer(tmp_path / "producer-2.txt", address)
    try:
        assert resumed.wait(300) == 0, (tmp_path / "run-trainer.txt").read_text()
        assert second.wait(60) == 0, (tmp_path / "producer-2.txt").read_text()
    finally:
        resumed.kill(), second.kill()
    step = re.search(r"resuming from \S+ at step (\d+)", (tmp_path / "run-trainer.txt").read_text())[1]
    assert int(step) >= 3 and f"sampling from batch {step} " in (tmp_path / "producer-2.txt").read_text()
    assert metrics(out) == metrics(reference)  # the checkpoint's older versions went to the new producer
    assert_same_params(reference / "model", out / "model")


def test_a_producer_with_no_trainer_says_so_in_one_line(tmp_path):
    log = tmp_path / "producer.txt"
    assert remote_producer(log, f"127.0.0.1:{free_port()}", "connect_timeout_s=1").wait(60) == 2
    assert last_line(log).startswith("rloo produce: error: the trainer at 127.0.0.1:")


def test_a_trainer_whose_port_is_taken_says_so_in_one_line(tiny_model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert remote_trainer(tiny_model_dir, tmp_path / "run", address).wait(120) == 2
    port = address.rsplit(":", 1)[1]
    assert last_line(tmp_path / "run-trainer.txt") == (
        f"rloo train: error: producer_address={address}: port {port} is in use on this machine; choose another port"
    )
    assert not (tmp_path / "run").exists()  # refused before anything is written
