"""Thread settings beside busy-looping processes: whole-command wall times (docs/results/threads).

    python benchmarks/threads_load.py --busy 0 2 8 --rounds 3 --json out.json \
        --variant 1t:OMP_NUM_THREADS=1 --variant 2t:OMP_NUM_THREADS=2,GOMP_SPINCOUNT=300000 \
        --variant policy: -- rloo sft num_examples=3000 epochs=1 output_dir=/tmp/t --overwrite

For each busy level (a count of `python3 -c 'while True: pass'` processes, started before and
killed after that level's runs) and each round, every variant runs the command once, in an order
rotated every round so that no variant always goes first; a variant is `name:K=V,K=V` (its
environment on top of this one's; `name:` adds nothing). Each run records its wall time, its CPU
time (user + system, from wait4: a waiting thread that spins shows as CPU time without progress)
and the 1-minute load average before and after. `work` instead of a command: a fixed amount of
small-matmul training steps in this process (what the thread runtime sees from an SFT step,
without the start-up), timed by itself and printed as JSON.

The busy loops die with this script on every exit path: killed in `finally`, SIGTERM/SIGHUP turned
into an exit, and each loop started with PR_SET_PDEATHSIG so that even a SIGKILL of this script
takes them down (Linux).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

BUSY = [sys.executable, "-c", "while True: pass"]


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(BUSY, preexec_fn=_die_with_parent) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, pairs = text.partition(":")
    env = dict(p.split("=", 1) for p in pairs.split(",") if p)
    return name, env


def run_once(cmd: list[str], env: dict[str, str], timeout: float) -> dict:
    """One run of `cmd`: wall and CPU seconds, exit status, load averages around it."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    wall = time.perf_counter() - start
    usage = _child_cpu()
    lines = out.decode(errors="replace").strip().splitlines() if out else []
    said = [x for x in lines if x.startswith("threads: ")]  # rloo's line when it took fewer threads than cores
    tail = lines[-1:]
    return {
        "threads_line": said[0] if said else "",
        "wall_s": round(wall, 2),
        "cpu_s": round(usage, 2),
        "rc": proc.returncode,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "last_line": tail[0] if tail else "",
    }


_cpu_seen = [0.0]


def _child_cpu() -> float:
    """CPU seconds of the children waited for since the last call (all children, busy loops still running
    are not counted: a child's time is added when it is waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    delta, _cpu_seen[0] = total - _cpu_seen[0], total
    return delta


def measure(cmd, variants, busy_levels, rounds, timeout, log, settle_s=0.0) -> list[dict]:
    rows = []
    for busy in busy_levels:
        procs = start_busy(busy)
        _child_cpu()
        try:
            time.sleep(settle_s if busy else 0.0)  # the load average sees them (a run's own choice reads it)
            for r in range(rounds):
                order = variants[r % len(variants) :] + variants[: r % len(variants)]
                for name, env in order:
                    row = {"busy": busy, "round": r, "variant": name, "env": env, **run_once(cmd, env, timeout)}
                    log(json.dumps(row))
                    rows.append(row)
        finally:
            stop_busy(procs)
            _child_cpu()  # the busy loops' time is not a run's
    return rows


def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for row in rows:
        key = f"busy={row['busy']}"
        out.setdefault(key, {}).setdefault(row["variant"], []).append(row)
    return {
        k: {
            v: {
                "median_wall_s": statistics.median(x["wall_s"] for x in rs),
                "median_cpu_s": statistics.median(x["cpu_s"] for x in rs),
                "load_before": [x["load_before"] for x in rs],
                "walls": [x["wall_s"] for x in rs],
            }
            for v, rs in vs.items()
        }
        for k, vs in out.items()
    }


def work(steps: int = 150, rows: int = 2048, width: int = 128) -> None:
    """`steps` forward+backward passes of a 2-layer MLP on (rows, width): SFT's many small parallel regions."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
    x = torch.randn(rows, width)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        net(x).square().mean().backward()
    print(
        json.dumps(
            {
                "work_s": round(time.perf_counter() - start, 3),
                "cpu_s": round(time.process_time() - cpu, 3),
                "threads": torch.get_num_threads(),
            }
        )
    )


def main() -> None:
    if sys.argv[1:2] == ["work"]:
        return work(*map(int, sys.argv[2:3]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--settle", type=float, default=30, help="seconds between starting busy loops and the first run")
    ap.add_argument("--json", required=True)
    ap.add_argument("cmd", nargs="+")
    args = ap.parse_args()

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    variants = [parse_variant(v) for v in args.variant]
    log = lambda s: print(s, flush=True)  # noqa: E731
    rows = measure(args.cmd, variants, args.busy, args.rounds, args.timeout, log, args.settle)
    result = {"command": args.cmd, "variants": args.variant, "cores": len(os.sched_getaffinity(0))}
    result |= {"rows": rows, "summary": summary(rows)}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
