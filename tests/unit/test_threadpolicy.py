"""rloo's thread defaults (rloo.runtime.threadpolicy): the OpenMP spin set before torch loads, the
thread count from the idle cores, the user's environment winning over both, and a resume taking the
count its run recorded where rloo chose it (rloo.runtime.cpukind.resume_threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from tests.helpers.child_env import child_env

from rloo.runtime import threadpolicy
from rloo.runtime.cpukind import resume_threads
from rloo.runtime.threadpolicy import (
    CHOSEN,
    SPIN,
    apply_thread_policy,
    busy_elsewhere,
    choose_threads,
    spin_default,
    thread_count,
)


def test_spin_default_yields_to_the_users_spin_or_wait_policy():
    assert spin_default({}) == {"GOMP_SPINCOUNT": SPIN}
    assert spin_default({"GOMP_SPINCOUNT": "300000"}) == {}
    assert spin_default({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


@pytest.mark.parametrize("user", [{}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "7"}])
def test_importing_rloo_sets_the_spin_before_torch_loads(user):
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: `import rloo` must set it first, and
    never over the user's own spin or wait policy (either decides libgomp's wait)."""
    env = {k: v for k, v in child_env(**user).items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | user
    code = "import sys, os, rloo; print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    expected = user.get("GOMP_SPINCOUNT", None if user else SPIN)
    assert out.split() == ["False", str(expected)]


def test_busy_elsewhere_is_the_lower_of_the_last_minute_and_now():
    assert busy_elsewhere(8.3, [10, 9, 10]) == 8.3  # sustained load: the average
    assert busy_elsewhere(9.0, [1, 1, 2]) == 0.0  # work that has just ended: only this process runs
    assert busy_elsewhere(0.2, [9, 9, 9]) == 0.2  # a burst the last minute did not see
    assert busy_elsewhere(3.0, []) == 3.0  # no /proc/loadavg: the average alone


@pytest.mark.parametrize(
    "cores,busy,threads",
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 8.0, 1), (16, 4.0, 12), (16, 0.0, 16), (1, 0.0, 1)],
)
def test_thread_count_is_the_idle_cores_at_least_one(cores, busy, threads):
    assert thread_count(cores, busy) == threads


def _machine(monkeypatch, cores, load1, running):
    monkeypatch.setattr(threadpolicy, "available_cores", lambda: cores)
    monkeypatch.setattr(threadpolicy.os, "getloadavg", lambda: (load1, load1, load1))
    monkeypatch.setattr(threadpolicy, "runnable_now", lambda: running)


def test_the_users_omp_num_threads_wins(monkeypatch):
    _machine(monkeypatch, 2, 9.0, [10])
    env = {"OMP_NUM_THREADS": "2"}
    assert choose_threads(env) is None and env == {"OMP_NUM_THREADS": "2"}


def test_a_busy_machine_gets_fewer_threads_marked_as_rloos_choice(monkeypatch):
    _machine(monkeypatch, 2, 9.0, [10, 10, 11])
    env: dict[str, str] = {}
    assert choose_threads(env) == (1, 2, 9.0)
    assert env == {"OMP_NUM_THREADS": "1", CHOSEN: "1"}
    _machine(monkeypatch, 2, 0.1, [1])  # a later command in the same process chooses again
    assert choose_threads(env) == (2, 2, 0.0) and env["OMP_NUM_THREADS"] == "2"


def test_the_policy_sets_torchs_count_and_says_why(monkeypatch):
    """torch may be loaded before the command runs (a --plugin, the preflight check): its count is set too."""
    _machine(monkeypatch, 2, 9.0, [10])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(CHOSEN, raising=False)
    torch.set_num_threads(2)
    line = apply_thread_policy(os.environ)
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert line is not None and "threads: 1 of 2 cores" in line


def test_a_resume_takes_the_recorded_count_where_rloo_chose_it():
    """Bit for bit whatever the load: the count rloo chose now gives way to the run's (2)."""
    torch.set_num_threads(1)
    env = {"OMP_NUM_THREADS": "1", CHOSEN: "1"}
    line = resume_threads(2, environ=env)
    assert torch.get_num_threads() == 2 and env["OMP_NUM_THREADS"] == "2"
    assert line is not None and "the count the run used" in line and "not bit for bit" not in line.split(";")[0]


@pytest.mark.parametrize(
    "env,adopt", [({"OMP_NUM_THREADS": "1"}, True), ({"OMP_NUM_THREADS": "1", CHOSEN: "1"}, False)]
)
def test_a_resume_keeps_the_users_count_and_says_so(env, adopt):
    torch.set_num_threads(1)
    line = resume_threads(2, adopt=adopt, environ=env)
    assert torch.get_num_threads() == 1
    assert line is not None and "with 1 thread(s) where the run used 2" in line
