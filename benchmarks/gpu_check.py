"""One short run on one CUDA GPU: the first GPU numbers of rloo, in one JSON file.

    python benchmarks/gpu_check.py --out gpu_check.json              # on the GPU machine: the checks (<= ~8 min)
    python benchmarks/gpu_check.py --parts bench --out gpu_bench.json  # the bench: a device call of its own
    python benchmarks/gpu_check.py --dry-run --out /tmp/dry.json  # CPU, tiny (tests/integration/test_gpu_check.py)

What it does: parts, each in its own process with its own time limit (a hang or a crash costs that part
only), the JSON rewritten after every part and every bench case (a timeout keeps what was done). With no
--parts it runs the checks (every part but bench and profile, which are run by name: each fills most of a
device call; docs/results/gpu-check says how the next lending runs them). Parts:
  update_fraction, collectives, train_resume, logprobs, guard_memory: benchmarks/gpu_check_parts.py
    (each would have caught one of the CUDA defects docs/precision.md lists; on the 1B shape where it matters);
  async_steps: rl.max_staleness=1, producer and trainer on the GPU: a `rloo train` run that must finish
    with is/* metrics and lag 1, and s/step at N = 0 against N = 1 on M (benchmarks/gpu_check_async.py);
  cuda_tests: `pytest -m cuda --continue-on-collection-errors`: the suite's CUDA tests (bf16 vs fp32
    log-probs and one RLOO step's gradient against tests/equivalence/test_precision.py's tolerances);
  vllm_tests: `pytest -m vllm` on VLLM_TESTS (test_vllm.py, test_vllm_lagged.py, test_vllm_bench.py), the tier of
    `make test-vllm`, here with the engine and the trainer on the GPU (needs vLLM 0.32.0 installed; its tests skip
    without it);
  bench: rloo eager, rloo captured and TRL's RLOOTrainer (when importable) alternating at 1B (32 and 256 rows),
    M and L, bf16 autocast over fp32 weights: s/step, the sampling ms per decode step against the bandwidth
    bound measured there (benchmarks/gpu_bench.py; --cases picks some);
  profile: one captured rloo step at 1B under torch.profiler, per phase against its bound
    (benchmarks/gpu_check_profile.py).
Assets (models, tokenizers) are built under --assets (default: a folder in $TMPDIR), never in the
output's folder. `ok` is true when every part finished and said ok.

Offline machine. The project's H200 machine has torch 2.11, transformers 5.17, accelerate and peft, and
no pydantic, datasets or TRL. Bring those as wheels (Python 3.12), from the repository root here:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl pydantic pydantic-core annotated-types typing-inspection typing-extensions trl==1.16.0 \\
        datasets dill multiprocess fsspec
(`unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist` lists what else one needs; keep one
version of each and stay under the 64 MiB a call may carry; 4.7 MB on 2026-12-04.) Then, there:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src
    bash benchmarks/gpu_check.sh
The image's pyarrow (25.0.1 on 2026-12-04) served `datasets`, so pyarrow need not travel. vLLM is not in the
image and its CUDA wheel with its needs is far over the 64 MiB a call may carry: vllm_tests is "not run" there.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

T_START = time.perf_counter()  # the budget counts from here: a cold machine's imports took ~30 s before main()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # beside this file, also when imported (the tests)
from gpu_bench import BENCH_LIMIT_S, CASES, DRY_CASES, bench_part  # noqa: E402

VLLM_TESTS = ("test_vllm.py", "test_vllm_lagged.py", "test_vllm_bench.py")  # the tier `make test-vllm` runs


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "accelerate", "peft", "trl", "pydantic", "datasets"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as e:  # noqa: BLE001 - absent or broken: record which
            out[name] = f"missing ({type(e).__name__})"
    import torch

    try:  # its version only: importing vLLM starts its platform detection
        out["vllm"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        out["vllm"] = "missing"
    out["cuda"] = torch.version.cuda
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out


def cuda_tests(timeout: float, paths: list[str] | None = None, marker: str = "cuda") -> dict:
    """The suite's tests marked `marker` under `paths` (default the whole tests folder), run by pytest in
    a child process; outcomes from its JUnit XML. vllm_tests: marker vllm (generation=vllm on CUDA;
    skipped where vLLM is not installed: `pip install vllm==0.32.0` beside this torch, as
    docs/install.md says)."""
    import xml.etree.ElementTree as ET

    xml = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_{os.getpid()}.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        marker,
        "--continue-on-collection-errors",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *(paths or [str(ROOT / "tests")]),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"timed out after {timeout:.0f} s"}
    cases = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            kids = [c.tag for c in case]
            outcome = next((k for k in ("failure", "error", "skipped") if k in kids), "passed")
            cases[f"{case.get('classname')}::{case.get('name')}"] = outcome
        xml.unlink()
    # pytest exits 5 when every test was deselected or skipped: no GPU in a dry run
    return {
        "rc": proc.returncode,
        "seconds": time.perf_counter() - t0,
        "tests": cases,
        "tail": proc.stdout[-2000:] + proc.stderr[-1000:],
    }


PART_LIMITS = {  # seconds; the whole run is capped by --budget (gpu_check.sh: under 10 minutes)
    # the bench is a call of its own (docs/results/gpu-check: "How to run the next lending"); its cases have their
    # own budgets inside this limit (benchmarks/gpu_bench.py)
    "bench": BENCH_LIMIT_S,
    "profile": 120,
    "update_fraction": 60,
    "collectives": 90,
    "train_resume": 150,
    "logprobs": 120,
    "guard_memory": 120,
    "async_steps": 240,
    "cuda_tests": 120,
    "vllm_tests": 240,
}
# with no --parts: the checks, which fit the budget together (on the H200 of 2026-12-04 they took ~250 s); the
# bench and the profile are run by name
DEFAULT_PARTS = [p for p in PART_LIMITS if p not in ("bench", "profile")]


def run_part(name: str, device: str, dry: bool, assets: Path, limit: float) -> dict:
    """One part of benchmarks/gpu_check_parts.py in a child process, killed after `limit` seconds."""
    result = assets / f"{name}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check_parts.py"), name, "--device", device,
           "--assets", str(assets), "--result", str(result)] + (["--dry-run"] if dry else [])  # fmt: skip
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {limit:.0f} s", "seconds": time.perf_counter() - t0}
    out = json.loads(result.read_text()) if result.exists() else {}
    if proc.returncode != 0:
        out["error"] = f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"
    return out | {"seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--dry-run", action="store_true", help="CPU, a tiny shape: checks the script itself")
    ap.add_argument("--no-trl", action="store_true", help="rloo only (TRL or datasets not installed)")
    ap.add_argument("--test-timeout", type=float, default=PART_LIMITS["cuda_tests"])
    # the suite's test of the dry run names one file: collecting every test module again took ~20 s of it
    ap.add_argument("--tests", nargs="+", default=None, help="cuda_tests: test paths (default: all of tests/)")
    # gpu_check.sh kills the whole run at 570 s: the margin is for the last part's stop and the last save
    ap.add_argument("--budget", type=float, default=530, help="seconds for all parts together, from start")
    ap.add_argument("--cases", default=None, help="bench: comma-separated cases (default: all, gpu_bench.CASES)")
    ap.add_argument("--assets", type=Path, default=None, help="where models are built (default: in $TMPDIR)")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="comma-separated parts (bench, profile: by name)")
    args = ap.parse_args(argv)
    # its import puts this checkout's rloo on sys.path unless PYTHONPATH names one (the mutated copy
    # mutation_check.py puts first): the parts and this process then import the same rloo
    import gpu_check_parts  # noqa: F401

    t0 = T_START
    assets = args.assets or Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_assets_{os.getuid()}"
    assets.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "cuda"
    cases = (args.cases or ",".join(DRY_CASES if args.dry_run else CASES)).split(",")
    trl = not args.no_trl and importlib.util.find_spec("trl") is not None
    out = {"dry_run": args.dry_run, "versions": versions(), "trl_side_by_side": trl, "parts": {}}
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    def save():
        out["seconds"], out["log"] = time.perf_counter() - t0, lines
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    limits = PART_LIMITS | {"cuda_tests": args.test_timeout}
    # a CPU shared with others runs the tiny bench and profile slower than a GPU the real ones: their limits stop a hang
    limits |= {"bench": 900, "profile": 300} if args.dry_run else {}
    for name in args.parts.split(","):
        left = args.budget - (time.perf_counter() - t0)
        if left < 10:
            out["parts"][name] = {"error": "not run: the budget was spent"}
            save()
            continue
        limit = min(limits[name], left)
        log(f"gpu_check: {name} (limit {limit:.0f} s)")
        if name == "cuda_tests":
            res = cuda_tests(limit, args.tests)
            out["cuda_tests"] = res
        elif name == "vllm_tests" and importlib.util.find_spec("vllm") is None:
            # every test would skip: say so rather than report a tier that passed (H200, 2026-12-04)
            res = out["vllm_tests"] = {"not_run": "vLLM is not installed here: pip install vllm==0.32.0"}
        elif name == "vllm_tests":
            res = cuda_tests(limit, [str(ROOT / "tests/integration" / f) for f in VLLM_TESTS], marker="vllm")
            out["vllm_tests"] = res
        elif name == "bench":  # in-process (its workers are its own children): each case under its own alarm
            res = out["bench"] = {}
            bench_part(cases, device, trl, assets / "bench", limit, log, res, save)
        elif name == "profile":  # its phases in full here, the summary under parts
            res = out["profile"] = run_part(name, device, args.dry_run, assets, limit)
        else:
            res = run_part(name, device, args.dry_run, assets, limit)
        out["parts"][name] = {k: v for k, v in res.items() if k not in ("tests", "cases", "machine", "phases")}
        log(json.dumps({name: {k: v for k, v in out["parts"][name].items() if k != "tail"}}, default=str)[:1500])
        save()
    out["ok"] = all(_part_ok(n, r) for n, r in out["parts"].items())
    save()
    not_run = [n for n, r in out["parts"].items() if "not_run" in r]
    print(
        f"gpu_check: wrote {args.out} ({out['seconds']:.0f} s), ok={out['ok']}"
        + (f", not run: {not_run}" * bool(not_run))
    )
    return 0 if out["ok"] else 1


def _part_ok(name: str, res: dict) -> bool:
    if "error" in res:
        return False
    if "not_run" in res:  # said in the JSON and the last line: nothing ran to fail
        return True
    if name in ("cuda_tests", "vllm_tests"):
        return res.get("rc") in (0, 5)
    if name == "bench":
        return True  # its cases carry their own errors (out["bench"]["cases"])
    return bool(res.get("ok"))


if __name__ == "__main__":
    sys.exit(main())
