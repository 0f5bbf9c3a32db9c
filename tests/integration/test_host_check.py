"""benchmarks/profile_step.py and benchmarks/host_check.py (docs/results/host-amx): a profile's phases
on a tiny shape, and host_check's jobs ending at its budget and with it, SIGKILL included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.child_env import child_env
from rloo.experiments import bench_assets

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_check  # noqa: E402
import profile_step  # noqa: E402

TINY = bench_assets.Shape("T", "char", 0, 32, 2, 2, 64, (6, 12), 8)


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_profiled_step_splits_its_operators_by_phase_and_leaves_the_step_as_it_was(tmp_path, monkeypatch):
    import rloo.algorithms.rloo as rloo_module

    monkeypatch.setitem(bench_assets.SHAPES, "T", TINY)
    monkeypatch.setattr(profile_step, "SHAPES", bench_assets.SHAPES)
    before = {name: getattr(rloo_module, name) for name in profile_step.PHASES}
    out = tmp_path / "p.json"
    args = ["--shape", "T", "--threads", "1", "--steps", "2", "--profile", "1", "--top", "60"]
    assert profile_step.main([*args, "--assets", str(tmp_path / "a"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [s["step"] for s in report["steps"]] == [0, 1]
    assert [s["profiled"] for s in report["steps"]] == [False, True]
    ops = report["steps"][1]["ops"]
    assert set(ops["by_phase"]) == {"rollout", "score", "update"} == set(report["steps"][1]["phases"])
    # each phase ran matmuls of its own (at this tiny width not always among its 5 costliest operators)
    for phase, rows in ops["by_phase"].items():
        assert 0 < len(rows) <= 60 and any(r["op"] in ("aten::mm", "aten::addmm", "aten::bmm") for r in rows), phase
    assert len(ops["by_self_cpu"]) <= 60
    assert {name: getattr(rloo_module, name) for name in profile_step.PHASES} == before  # labels removed


def run_host_check(tmp_path: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, str(ROOT / "benchmarks" / "host_check.py"), "--out", str(tmp_path / "out")]
    argv += ["--work", str(tmp_path / "work"), "--calc-seeds", "0", "--bench", "", "--peak-seconds", "0", *extra]
    return subprocess.Popen(argv, env=child_env())


def job_pid(out: Path, timeout: float = 60) -> int:
    """The first job's pid once host.json names it."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            pid = json.loads((out / "host.json").read_text())["jobs"][0].get("pid")
        except (FileNotFoundError, json.JSONDecodeError):
            pid = None
        if pid:
            return pid
        time.sleep(0.1)
    raise TimeoutError("no job started")


def test_a_job_still_running_at_the_budget_is_killed_and_listed(tmp_path):
    proc = run_host_check(tmp_path, "--budget", "2")  # the full calculator pipeline: minutes
    assert proc.wait(timeout=60) == 1
    job = json.loads((tmp_path / "out" / "host.json").read_text())["jobs"][0]
    assert job["status"] == "killed" and job["rc"] is None
    assert not alive(job["pid"])


def test_jobs_die_with_the_script_even_when_it_is_sigkilled(tmp_path):
    proc = run_host_check(tmp_path, "--budget", "300")
    try:
        pid = job_pid(tmp_path / "out")
        time.sleep(0.5)
        assert alive(pid)  # the full calculator pipeline runs for minutes
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t_end = time.monotonic() + 10
        while alive(pid) and time.monotonic() < t_end:
            time.sleep(0.05)
        assert not alive(pid), "the job outlived host_check.py"
    finally:
        proc.kill()
        if "pid" in locals() and alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_dry_run_runs_the_calculator_demo_and_the_profile_and_keeps_their_results(tmp_path):
    out = tmp_path / "out"
    args = ["--out", str(out), "--work", str(tmp_path / "w"), "--calc-seeds", "0", "--bench", "", "--peak-seconds", "0"]
    rc = host_check.main([*args, "--profile", "--dry-run", "--budget", "300"])
    jobs = json.loads((out / "host.json").read_text())["jobs"]
    assert rc == 0 and [(j["name"], j["status"]) for j in jobs] == [("calc-t1-s0", "done"), ("profile", "done")]
    summary = json.loads((out / "calc-t1" / "seed0" / "summary.json").read_text())
    assert summary["task"] == "calculator" and "pass_at_1" in summary["eval"]["policy"]
    profile = json.loads((out / "profile-S-bf16.json").read_text())
    assert len(profile["steps"]) == 2 and profile["steps"][1]["profiled"]


def test_bench_shape_groups_are_one_job_each_on_their_own_two_cores(tmp_path):
    """--bench-shapes "S,M;L": per dtype one `rloo bench` job for S and M (named as before) and one for
    L, each 2 cores, each copying its own bench.json (the L job ran beside S and M on the AMX host)."""
    ap = ["--out", str(tmp_path), "--calc-seeds", "", "--calc-threads", "", "--bench", "bfloat16,float32"]
    args = host_check.parser().parse_args([*ap, "--bench-shapes", "S,M;L", "--work", str(tmp_path / "w")])
    jobs = host_check.jobs(args, tmp_path)
    shapes = {j["name"]: next(a for a in j["argv"] if a.startswith("shapes=")) for j in jobs}
    assert shapes == {
        "bench-bfloat16": "shapes=[S,M]",
        "bench-bfloat16-L": "shapes=[L]",
        "bench-float32": "shapes=[S,M]",
        "bench-float32-L": "shapes=[L]",
    }
    assert all(j["cores"] == 2 for j in jobs)
    copies = [dst.name for j in jobs for dst in j["copy"].values()]
    assert sorted(copies) == sorted(f"{name}.json" for name in shapes)


def test_the_quiet_peak_probe_measures_both_dtypes_in_a_pinned_child(monkeypatch):
    """host.json's matmul peaks come from a child on two cores before any job starts: both dtypes,
    positive GFLOP/s; a probe that fails is recorded as an error, not raised."""
    peaks = host_check.quiet_peaks(0.05)
    assert set(peaks) == {"bfloat16", "float32"} and all(v > 0 for v in peaks.values()), peaks
    monkeypatch.setattr(host_check, "PEAK", "raise SystemExit(3)")
    assert set(host_check.quiet_peaks(0.05)) == {"error"}
