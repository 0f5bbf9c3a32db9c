"""A lost torchrun process, in process (the torchrun launch: tests/reliability/test_torchrun_kill.py):
its peers are looked up in /proc, a collective's failure or torchrun's SIGTERM becomes one line that
names the rank that is gone and the checkpoint to resume from, and rloo's own errors pass unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rloo.errors import Interrupted, RewardError, RlooError
from rloo.runtime.distributed import Dist
from rloo.runtime.peers import Peer, gone_ranks, start_time, this_process
from rloo.runtime.signals import StopFlag

# what gloo raised in the survivor of `torchrun --nproc_per_node 2` when the other process was killed
GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:55185. This is typically caused by a remote worker crashing."
)


@pytest.fixture
def dead() -> Peer:
    """A process that ran on this host and is gone (exited and reaped), as a peer recorded at its start."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    peer = Peer(this_process().host, child.pid, start_time(child.pid))
    child.communicate(b"")
    return peer


@pytest.fixture
def sigterm_kept():
    """The test's SIGTERM handler back after a block that sets SIGTERM to ignored."""
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)


def test_a_peer_is_gone_when_its_pid_is_gone_or_reused(dead):
    me = this_process()
    assert me.started is not None
    assert gone_ranks([me, me], 0) == []  # alive
    assert gone_ranks([me, dead], 0) == [1]
    assert gone_ranks([me, Peer(me.host, me.pid, me.started + 1)], 0) == [1]  # the pid now another process's
    assert gone_ranks([me, Peer("elsewhere", dead.pid, dead.started)], 0) == []  # another host: cannot tell
    assert gone_ranks([dead, me], 0) == []  # a process never counts itself


def _raised_within(d: Dist, e: BaseException, newest: Path | None) -> BaseException:
    with pytest.raises(BaseException) as info:
        with d.lost_peers_reported(lambda: newest):
            raise e
    return info.value


def test_a_collective_failure_after_a_lost_rank_is_one_line_naming_it(dead, tmp_path, sigterm_kept):
    d = Dist(rank=0, world=2, peers=(this_process(), dead))
    newest = tmp_path / "checkpoints" / "step-000006"
    got = _raised_within(d, RuntimeError(GLOO), newest)
    assert type(got) is RlooError and "\n" not in str(got)
    assert str(got).startswith(f"rank 1 of 2 (pid {dead.pid}) is gone (killed, or it crashed")
    assert "this process (rank 0) stopped with it" in str(got)
    assert f"the newest complete checkpoint is {newest}; continue with the same command plus resume=True" in str(got)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # torchrun's SIGTERM after the line: no second line
    # torchrun's SIGTERM turned into an interrupt (the step finished, rank 0 saved) is told the same way
    got = _raised_within(d, Interrupted("SIGTERM received; stopped at step 7/24", signal.SIGTERM), None)
    assert type(got) is RlooError and str(got).startswith(f"rank 1 of 2 (pid {dead.pid}) is gone")
    assert str(got).endswith("no checkpoint yet (step 0); continue with the same command plus resume=True")


def test_a_collective_failure_with_no_local_peer_gone_says_so(tmp_path, sigterm_kept):
    me = this_process()
    d = Dist(rank=1, world=2, peers=(Peer("other-host", 1, 1), me))
    got = _raised_within(d, RuntimeError(GLOO), None)
    assert type(got) is RlooError
    assert str(got).startswith("another process of the run stopped: a collective of rank 1 of 2 failed ([/__w/")


def test_rloos_own_errors_and_unrelated_failures_pass_unchanged(dead):
    lost = Dist(rank=0, world=2, peers=(this_process(), dead))
    own = RewardError("the reward raised")
    assert _raised_within(lost, own, None) is own  # its own line says more than the lost peer's
    alive = Dist(rank=0, world=2, peers=(this_process(), this_process()))
    bug = RuntimeError("shape mismatch")
    assert _raised_within(alive, bug, None) is bug  # a real bug keeps its traceback
    single = Dist()  # one process: nothing to lose
    assert _raised_within(single, RuntimeError(GLOO), None).__class__ is RuntimeError


def test_torchruns_sigterm_after_a_lost_peer_says_no_checkpoint_note(capsys):
    """The loop's StopFlag (quiet=Dist.peer_gone): the signal is recorded, no "writing a checkpoint"
    note is said, and a second one does not stop at once (the step's collective does)."""
    with StopFlag(quiet=lambda: True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM
    assert "received SIGTERM" not in capsys.readouterr().err
    with StopFlag(quiet=lambda: False) as stop:  # the user's signal: said as before
        os.kill(os.getpid(), signal.SIGTERM)
    assert "received SIGTERM: stopping after this step" in capsys.readouterr().err
