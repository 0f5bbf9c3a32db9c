"""What a session measures on a CPU kind it does not otherwise get, on a many-core host lent for a short
while (the GPU machine's host: an Intel Xeon with AMX-BF16, 16 cores): jobs pinned to cores, run side by
side within one time budget, their results copied to --out as each finishes.

    python benchmarks/host_check.py --out OUT [--budget 480] [--calc-seeds 0-9] [--calc-threads 1,2]
        [--bench bfloat16,float32] [--bench-shapes "S,M;L"] [--profile] [--cuda-profile] [--dry-run]

Jobs (each one process group, pinned with sched_setaffinity to its own cores, OMP_NUM_THREADS = its cores):
  calc-T-sS  `rloo pipeline task=calculator seed=S` (the README's agent demo, its defaults) at T threads,
             for S in --calc-seeds and T in --calc-threads (1-thread seeds first); copies summary.json and
             the log (benchmarks/agents_seeds.py tabulates them). GPUs hidden: the CPU is the question.
  bench-D    `rloo bench dtype=D "shapes=[S,M]" threads=2` with TRL side by side (needs TRL), 2 cores;
             --bench-shapes "S,M;L": one such job per group, each on its own 2 cores (bench-D-L).
  profile    benchmarks/profile_step.py at M in bf16 on 2 cores: each phase's top operators.
  cuda       benchmarks/profile_step.py --device cuda at 1B in bf16: rloo's warm-up step by step.
Jobs start in that order (ORDER) as cores free up, one logical CPU per physical core first. At the
budget every job still running is killed (its process group) and listed as `killed`; a job's process
is SIGKILLed if this script dies, however it dies. host.json: the CPU (model, flags of interest,
topology), its bf16 and fp32 matmul peaks at 2 threads measured before any job starts (--peak-seconds),
each job's command, cores, pid, status, rc and seconds; rewritten as jobs start and end.
The device tool brings back a limited number of files: pack --out into one archive before the call ends
(`tar -cJf $OUT/host.tar.xz -C $OUT host`), or its run folders' summaries are lost (docs/results/host-amx).
--dry-run: tiny settings (calculator: 1 SFT epoch, 2 RL steps, 8 prompts; bench: S, 1+1 steps) to check
the script itself on any machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RLOO = [sys.executable, "-c", "import sys; from rloo.cli import main; sys.exit(main(sys.argv[1:]))"]
FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
PR_SET_PDEATHSIG = 1  # linux/prctl.h, as rloo.runtime.link.child
DRY_CALC = ["sft.epochs=1", "sft.num_examples=200", "rl.steps=2", "eval.num_prompts=8", "eval.pass_samples=8"]


def cpu_facts() -> dict:
    """The CPU's model, the flags that decide precision here, and its logical CPUs grouped by core."""
    text = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "cores": physical_order()}


def physical_order() -> list[list[int]]:
    """This process's logical CPUs grouped by (package, core): siblings of one core together."""
    groups: dict[tuple[str, str], list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = ("?", str(cpu))
        groups.setdefault(key, []).append(cpu)
    return list(groups.values())


def cpu_pool() -> list[int]:
    """Logical CPUs in the order jobs take them: the first of every core, then their siblings."""
    cores = physical_order()
    depth = max(len(c) for c in cores)
    return [c[i] for i in range(depth) for c in cores if i < len(c)]


# the matmul peaks at 2 threads, in a child pinned like a job (this launcher does not import torch)
PEAK = (
    "import json, sys, torch; from rloo.experiments.bench_machine import matmul_peak_flops as peak; "
    "print(json.dumps({d: peak(2, float(sys.argv[1]), getattr(torch, d)) / 1e9 for d in ('bfloat16', 'float32')}))"
)


def quiet_peaks(seconds: float) -> dict:
    """bf16 and fp32 matmul peaks (GFLOP/s, 2 threads) on the first two cores, before any job starts:
    each `rloo bench` job probes its own while the others build their models, and on the AMX host those
    probes gave 572-1480 GFLOP/s in bf16 (docs/results/host-amx). {"error": ...} if the probe failed."""
    cpus, parent = cpu_pool()[:2], os.getpid()
    env = os.environ | {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PEAK, str(seconds)], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=120 + 6 * seconds, check=True, preexec_fn=lambda: pinned_child(cpus, parent),
        )  # fmt: skip
        return {d: round(v, 1) for d, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {str(e)[-300:]}"}


ORDER = ("calc-t1-", "bench-bfloat16", "profile", "cuda", "bench-", "calc-")
"""Start order, by name prefix: the 1-thread calculator seeds, bf16 bench, profiles, the rest."""


def jobs(args, out: Path) -> list[dict]:
    """The jobs in start order (ORDER): name, argv, cores wanted, env, and the files to copy when done."""
    todo = []
    env_cpu = {"CUDA_VISIBLE_DEVICES": ""}
    if args.cuda_profile:
        args_ = "--device cuda --shape 1B --dtype bfloat16 --steps 8 --profile 0,1,6".split()
        argv = [sys.executable, "benchmarks/profile_step.py", *args_, "--json", str(out / "profile-cuda-1B.json")]
        todo.append({"name": "cuda", "argv": argv, "cores": 2, "env": {}})
    steps = ["warmup=1", "steps=1"] if args.dry_run else ["warmup=1", "steps=5"]
    for dtype in [d for d in args.bench.split(",") if d]:
        for group in ["S"] if args.dry_run else args.bench_shapes.split(";"):
            name = f"bench-{dtype}" + ("" if group == "S,M" else "-" + group.replace(",", ""))
            argv = RLOO + ["bench", f"dtype={dtype}", f"shapes=[{group}]", "threads=2", *steps]
            argv += [f"output_dir={args.work / name}"]
            todo.append({"name": name, "argv": argv, "cores": 2, "env": env_cpu,
                         "copy": {args.work / name / "bench.json": out / f"{name}.json"}})  # fmt: skip
    if args.profile:
        shape, steps = ("S", "2") if args.dry_run else ("M", "4")
        argv = [sys.executable, "benchmarks/profile_step.py", "--shape", shape, "--dtype", "bfloat16", "--threads", "2"]
        argv += ["--steps", steps, "--profile", "1", "--json", str(out / f"profile-{shape}-bf16.json")]
        todo.append({"name": "profile", "argv": argv, "cores": 2, "env": env_cpu})
    for threads in [int(t) for t in args.calc_threads.split(",") if t]:
        for seed in seeds(args.calc_seeds):
            run = args.work / f"calc-t{threads}" / f"seed{seed}"
            argv = RLOO + ["pipeline", "task=calculator", f"seed={seed}", f"output_dir={run}", "report_to=none"]
            argv += DRY_CALC if args.dry_run else []
            copy = {run / "summary.json": out / f"calc-t{threads}" / f"seed{seed}" / "summary.json"}
            todo.append(
                {"name": f"calc-t{threads}-s{seed}", "argv": argv, "cores": threads, "env": env_cpu, "copy": copy}
            )
    return sorted(todo, key=lambda j: next(i for i, pre in enumerate(ORDER) if j["name"].startswith(pre)))


def seeds(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def start(job: dict, cpus: list[int], logs: Path) -> subprocess.Popen:
    env = os.environ | job["env"] | {"OMP_NUM_THREADS": str(len(cpus)), "PYTHONUNBUFFERED": "1"}
    log = open(logs / f"{job['name']}.log", "w")  # noqa: SIM115 - the child writes it; closed with the job
    parent = os.getpid()
    proc = subprocess.Popen(
        job["argv"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: pinned_child(cpus, parent),
    )  # fmt: skip
    job.update(cpus=cpus, pid=proc.pid, t0=time.perf_counter(), log=log, status="running")
    return proc


def pinned_child(cpus: list[int], parent: int) -> None:
    """In the job's process before exec: its cores, and SIGKILL when this script dies (even by SIGKILL:
    its own session is out of reach of a Ctrl-C or a kill of this script's process group)."""
    os.sched_setaffinity(0, cpus)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # this script died before prctl took effect
        os._exit(1)


def finish(job: dict, rc: int | None) -> None:
    job["log"].close()
    job.update(rc=rc, seconds=round(time.perf_counter() - job.pop("t0"), 1), status="done" if rc == 0 else "failed")
    for src, dst in job.get("copy", {}).items():
        if Path(src).exists():
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)


def schedule(todo: list[dict], budget: float, out: Path, report: dict) -> None:
    """Start jobs in order as cores free up (a job that does not fit waits; none overtakes it), until
    all are done or the budget is spent; then kill what still runs."""
    free, running, t_end = cpu_pool(), {}, time.perf_counter() + budget
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pending = list(todo)
    while (pending or running) and time.perf_counter() < t_end:
        while pending and pending[0]["cores"] <= len(free):
            job = pending.pop(0)
            cpus, free = free[: job["cores"]], free[job["cores"] :]
            running[job["name"]] = (start(job, cpus, logs), job)
            write(out, report)
        for name, (proc, job) in list(running.items()):
            if proc.poll() is not None:
                finish(job, proc.returncode)
                free += job["cpus"]
                del running[name]
                write(out, report)
        time.sleep(1)
    for proc, job in running.values():
        with_group(proc, signal.SIGKILL)
        proc.wait()
        finish(job, None)
        job["status"] = "killed"
    for job in pending:
        job["status"] = "not started"
    write(out, report)


def with_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def write(out: Path, report: dict) -> None:
    keep = ("name", "argv", "cores", "cpus", "pid", "status", "rc", "seconds")
    rows = [{k: (list(map(str, v)) if k == "argv" else v) for k, v in j.items() if k in keep} for j in report["jobs"]]
    (out / "host.json").write_text(json.dumps(report | {"jobs": rows}, indent=1))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None, help="run folders (default: a folder in $TMPDIR)")
    ap.add_argument("--budget", type=float, default=480, help="seconds for all jobs together")
    ap.add_argument("--calc-seeds", default="0-9")
    ap.add_argument("--calc-threads", default="1", help="comma-separated thread counts, each over every seed")
    ap.add_argument("--bench", default="bfloat16,float32", help="comma-separated dtypes for rloo bench (empty: none)")
    ap.add_argument(
        "--bench-shapes",
        default="S,M",
        help="shape groups, ';' between them: one bench job (2 cores) per dtype and group",
    )
    ap.add_argument("--profile", action="store_true", help="profile_step.py at M, bf16, 2 threads")
    ap.add_argument("--cuda-profile", action="store_true", help="profile_step.py on CUDA at 1B, bf16")
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="the quiet peak probe's time per dtype (0: none)")
    ap.add_argument("--dry-run", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "rloo-host-check"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"cpu": cpu_facts(), "budget_s": args.budget, "jobs": jobs(args, args.out)}
    if args.peak_seconds > 0:  # before the budget's clock starts
        report["peak_gflops_2_threads_before_jobs"] = quiet_peaks(args.peak_seconds)
    write(args.out, report)
    schedule(report["jobs"], args.budget, args.out, report)
    return 0 if all(j["status"] == "done" for j in report["jobs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
