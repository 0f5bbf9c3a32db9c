"""One short run on one CUDA GPU: the first GPU numbers of rloo, in one JSON file.

    python benchmarks/gpu_check.py --out gpu_check.json              # on the GPU machine (<= ~8 min)
    python benchmarks/gpu_check.py --dry-run --out /tmp/dry.json  # CPU, tiny (tests/integration/test_gpu_check.py)

What it does, each part with its own time limit so one slow part cannot eat the others:
  1. `pytest -m cuda`: the suite's CUDA tests (bf16 vs fp32 log-probs and one RLOO step's gradient on
     the GPU against the tolerances derived in tests/equivalence/test_precision.py), outcomes per test;
  2. `rloo bench` on CUDA in bf16 for the shapes M, L and 1B (Pythia-1B-sized Llama, random weights,
     M's tokenizer; rloo.experiments.bench_assets), with TRL's RLOOTrainer side by side when TRL is importable:
     s/step, completion tokens/s, peak GPU memory, and MFU (achieved FLOP/s over the bf16 matmul peak
     measured on the GPU at start);
  3. everything, with the versions and the GPU's name, into --out.

Offline machine. The project's H200 machine has torch 2.11, transformers 5.17, accelerate and peft, and
no pydantic, datasets or TRL. Bring those as wheels (Python 3.12), from the repository root here:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl pydantic pydantic-core annotated-types typing-inspection pyyaml trl datasets dill \\
        multiprocess xxhash pyarrow fsspec
(`unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist` lists what else one needs; keep one
version of each and stay under the 64 MiB a call may carry: pyarrow alone is ~40 MiB, so without
room for it run with --no-trl, since only TRL's worker needs `datasets`.) Then, there:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src
    bash benchmarks/gpu_check.sh
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "accelerate", "peft", "trl", "pydantic", "datasets"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as e:  # noqa: BLE001 - absent or broken: record which
            out[name] = f"missing ({type(e).__name__})"
    import torch

    out["cuda"] = torch.version.cuda
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out


def cuda_tests(timeout: float) -> dict:
    """The suite's CUDA-marked tests, run by pytest in a child process; outcomes from its JUnit XML."""
    import xml.etree.ElementTree as ET

    xml = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_{os.getpid()}.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "cuda",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        str(ROOT / "tests"),
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


def bench(shapes: list, device: str, dtype: str, trl: bool, steps: int, root: Path, log) -> dict:
    """`rloo bench` in-process for each shape (rloo.experiments.bench.bench_shape), bf16, alternating the
    trainers."""
    import torch

    from rloo.experiments.bench import bench_dtype, bench_shape
    from rloo.experiments.bench_machine import machine, matmul_peak_flops

    dtype = bench_dtype(dtype, device)
    peak = matmul_peak_flops(threads=min(16, os.cpu_count() or 1), dtype=getattr(torch, dtype), device=device)
    report = {"machine": machine(), "device": device, "dtype": dtype, "matmul_peak_gflops": peak / 1e9, "shapes": []}
    for shape in shapes:
        t0 = time.perf_counter()
        try:
            res = bench_shape(
                shape,
                root=root,
                warmup=1,
                steps=steps,
                k=4,
                batch_size=8,
                beta=0.05,
                lr=1e-6,
                seed=0,
                threads=min(16, os.cpu_count() or 1),
                peak=peak,
                trainers=["rloo", "trl"] if trl else ["rloo"],
                device=device,
                dtype=dtype,
                log=log,
            )
        except Exception as e:  # noqa: BLE001 - one shape failing (e.g. out of memory) must not lose the others
            res = {"shape": shape.name, "error": f"{type(e).__name__}: {e}"}
        res["seconds"] = time.perf_counter() - t0
        report["shapes"].append(res)
        log(json.dumps({k: v for k, v in res.items() if k != "results"}))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--dry-run", action="store_true", help="CPU, a tiny shape: checks the script itself")
    ap.add_argument("--no-trl", action="store_true", help="rloo only (TRL or datasets not installed)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per trainer and shape")
    ap.add_argument("--test-timeout", type=float, default=150)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from rloo.experiments.bench_assets import SHAPES, Shape

    t0 = time.perf_counter()
    if args.dry_run:
        device = "cpu"
        shapes = [
            Shape(
                name="tiny",
                tokenizer="char",
                vocab_size=0,
                hidden=32,
                layers=2,
                heads=2,
                intermediate=64,
                prompt_tokens=(6, 12),
                max_new_tokens=8,
            )
        ]
    else:
        device = "cuda"
        shapes = [SHAPES[n] for n in ("M", "L", "1B")]
    trl = not args.no_trl and importlib.util.find_spec("trl") is not None
    out = {"dry_run": args.dry_run, "versions": versions(), "trl_side_by_side": trl}
    out["cuda_tests"] = cuda_tests(args.test_timeout)
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    out["bench"] = bench(shapes, device, "bfloat16", trl, args.steps, Path(args.out).parent / "gpu_check_assets", log)
    out["seconds"] = time.perf_counter() - t0
    out["log"] = lines
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"gpu_check: wrote {args.out} ({out['seconds']:.0f} s)")
    ok = out["cuda_tests"].get("rc") in (0, 5) and all("error" not in s for s in out["bench"]["shapes"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
