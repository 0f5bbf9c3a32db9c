"""The producer link's address and waits (rl.producer_address, `rloo produce`; docs/async.md "Across
machines", docs/reliability.md): a malformed, unresolvable, foreign or busy address is one line
before anything is written; each side waits a bounded, configurable time and stops at once on
SIGTERM; a second producer for one trainer is told so. Only loopback addresses and names that
cannot resolve (*.invalid) are used: no traffic leaves the machine."""

from __future__ import annotations

import errno
import signal
import socket
import time
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.errors import ConfigError
from rloo.runtime.link import address as address_module

from ._procs import Cli, alive, children, free_port, last_line, remote_producer, remote_trainer, wait_for_steps
from .test_bad_input import _one_line

RW = "reward_fn=reliability._helpers:reward_short"


def _wait_for_line(log: Path, proc: Cli, text: str, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, log.read_text()
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{text!r} not said in {timeout} s")


@pytest.mark.parametrize(
    "address, needle",
    [
        (
            "nonexistent.invalid:29511",
            "address=nonexistent.invalid:29511: the host 'nonexistent.invalid' does not",
        ),
        ("256.1.1.1:29511", "address: 256.1.1.1 is not an IPv4 address"),
        ("http://localhost:29511", "address: no scheme such as http://"),
        ("localhost:29511:1", "address: one colon, before the port"),
    ],
)
def test_produce_refuses_a_bad_address_at_once(address, needle, capsys):
    t = time.monotonic()
    rc = main(["produce", f"address={address}", "connect_timeout_s=5"])
    _one_line(rc, capsys.readouterr().err.strip(), "rloo produce: error: ", needle)
    assert time.monotonic() - t < 3


def test_a_busy_port_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    """It once stopped the run after the models loaded, leaving config.yaml behind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tmp_path / "run"
        argv = ["train", f"policy={tiny_model_dir}", f"output_dir={out}", RW, "max_staleness=1"]
        rc = main([*argv, f"producer_address=127.0.0.1:{port}"])
    _one_line(rc, capsys.readouterr().err.strip(), f"producer_address=127.0.0.1:{port}: port {port} is in use")
    assert not out.exists()


def test_an_address_of_another_machine_is_refused(monkeypatch):
    """The trainer listens at HOST: a HOST this machine cannot bind (EADDRNOTAVAIL; played here
    without a foreign address) is refused."""

    def bind(self, where):
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    monkeypatch.setattr(address_module.socket.socket, "bind", bind)
    with pytest.raises(ConfigError, match="127.0.0.1 is not an address of this machine"):
        address_module.check_trainer_address("127.0.0.1:29511")


def test_a_trainer_waiting_for_its_producer_stops_at_once_on_sigterm(tiny_model_dir, tmp_path):
    """The wait ran inside the native rendezvous, which returns to Python (and its signal handler)
    only at its 600 s timeout: SIGTERM at 120 s ended the run at ~740 s."""
    address = f"127.0.0.1:{free_port()}"
    out, log = tmp_path / "run", tmp_path / "run-trainer.txt"
    trainer = remote_trainer(tiny_model_dir, out, address, "producer_connect_timeout_s=600")
    try:
        _wait_for_line(log, trainer, "waiting for the rollout producer")
        family = children(trainer.pid)
        t = time.monotonic()
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(20) == 128 + signal.SIGTERM
        assert time.monotonic() - t < 20
    finally:
        trainer.kill()
    assert last_line(log).startswith("rloo train: interrupted by SIGTERM; rerun with --resume")
    assert not [p for p in family if alive(p)], "a process of the run was left behind"


def test_a_trainer_nobody_joins_says_so_in_bounded_time(tiny_model_dir, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    out, log = tmp_path / "run", tmp_path / "run-trainer.txt"
    trainer = remote_trainer(tiny_model_dir, out, address, "producer_connect_timeout_s=1")
    try:
        _wait_for_line(log, trainer, "waiting for the rollout producer")
        assert trainer.wait(30) == 2
    finally:
        trainer.kill()
    assert last_line(log) == (
        f"rloo train: error: no rollout producer joined at {address} within 1 s (producer_connect_timeout_s); "
        f"start `rloo produce address={address}` on its machine, then rerun with --resume"
    )


def test_a_producer_facing_a_silent_listener_gives_up_in_bounded_time(tmp_path):
    """Something accepts at the address but never answers the rendezvous: the native client waited
    with no end (not even its timeout), deaf to signals."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        log = tmp_path / "producer.txt"
        producer = remote_producer(log, f"127.0.0.1:{silent.getsockname()[1]}", "connect_timeout_s=2")
        try:
            assert producer.wait(60) == 2
        finally:
            producer.kill()
    assert "did not answer as an rloo rendezvous within 2 s" in last_line(log)


def test_a_second_producer_is_told_the_trainer_has_one(tiny_model_dir, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    trainer = remote_trainer(tiny_model_dir, out, address, steps=200)
    first, second = remote_producer(tmp_path / "producer.txt", address), None
    try:
        wait_for_steps(out, trainer, 1)
        second = remote_producer(tmp_path / "producer-2.txt", address, "connect_timeout_s=30")
        assert second.wait(120) == 2
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(120) == 128 + signal.SIGTERM
        assert first.wait(60) == 0
    finally:
        for proc in (trainer, first, second):
            if proc is not None:
                proc.kill()
    assert last_line(tmp_path / "producer-2.txt") == (
        f"rloo produce: error: the trainer at {address} already has its rollout producer (one per run)"
    )
    assert last_line(tmp_path / "producer.txt") == "the trainer's run ended: stopping"
