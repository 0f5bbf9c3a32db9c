"""benchmarks/gpu_check_parts.py's `async_steps` part: asynchronous RLOO (rl.max_staleness, docs/async.md)
with the rollout producer and the trainer on the same device (one GPU; the CPU in the dry run).

1. `rloo train ... max_staleness=1` on the tiny policy: it must finish, log the is/* metrics every
   step and sample every batch after the first with the weights of one update before (is/lag 1).
2. Step time at N = 0 and N = 1 side by side: `rloo bench`'s rloo trainers (rloo.experiments.bench,
   staleness=[0,1], no TRL) on the M shape under bf16 (a tiny shape in the dry run), the trainer's
   wait for the producer's batch included; the first 2 steps are not timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))  # helpers.child_env: last, so that nothing there shadows a module
IS_KEYS = ("is/lag", "is/ratio_mean", "is/ratio_max", "is/ratio_min", "is/truncated", "is/weight_mean")


def tiny_policy(assets: Path) -> Path:
    """A 2-layer, 32-wide Llama with the summarize task's tokenizer, built once under `assets`."""
    from rloo.config import ArchConfig
    from rloo.modeling.loading import build_llama
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    model_dir = assets / "tiny_policy"
    if not (model_dir / "config.json").exists():
        tok = build_tokenizer(get_task("summarize"))
        arch = ArchConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64)
        build_llama(arch, tok, seed=0).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    return model_dir


def threads() -> int:
    """torch threads of the runs: at least 2, so that the producer gets a process with half of them."""
    return max(2, min(16, os.cpu_count() or 1))


def child_env(**overrides: str) -> dict[str, str]:
    """The environment of a child that must import the rloo this process imported (not this checkout's
    src/: under benchmarks/mutation_check.py that is the unmutated source): tests/helpers/child_env.py's
    rule, imported when called, after the caller has put its rloo on the path."""
    from helpers.child_env import child_env as env

    return env(**overrides)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`rloo ARGS` importing the rloo this process imported (`child_env`), on threads() threads (with
    one, rloo would simulate the lag in the trainer's process instead of starting the producer)."""
    env = child_env(OMP_NUM_THREADS=str(threads()))
    return subprocess.run([sys.executable, "-m", "rloo.cli", *args], capture_output=True, text=True, env=env, cwd=cwd)


def async_train(device: str, assets: Path, steps: int = 4) -> dict:
    """Part 1: a short `rloo train` at max_staleness=1; the lag and is/* metrics it logged."""
    model, run = tiny_policy(assets), assets / "async_run"
    proc = cli(["train", f"policy={model}", f"reward_model={model}", f"output_dir={run}", f"device={device}",
                "batch_size=2", "k=2", "max_new_tokens=5", f"steps={steps}", "max_staleness=1", "eval_every=null",
                "eval_prompts=4", "eval.batch_size=4", "save_every=null", "--overwrite"], assets)  # fmt: skip
    metrics = run / "metrics.jsonl"
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if "is/lag" in r] if metrics.exists() else []
    lags = [r["is/lag"] for r in rows]
    out = {"rc": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:], "lags": lags}
    out |= {k: [r.get(k) for r in rows] for k in IS_KEYS[1:]}
    out["producer_process"] = bool(rows) and "time/producer_sample" in rows[-1]  # not the in-process simulation
    # batch 0 is sampled with the starting weights (lag 0); every later one with those of the update before
    lagged = lags == [0.0] + [1.0] * (steps - 1) and all(k in rows[-1] for k in IS_KEYS)
    out["ok"] = proc.returncode == 0 and lagged and out["producer_process"]
    return out


def async_bench(device: str, dry: bool, assets: Path) -> dict:
    """Part 2: s/step at N = 0 and N = 1 (rloo.experiments.bench_shape, rloo only, alternated)."""
    from rloo.experiments.bench import bench_dtype, bench_shape
    from rloo.experiments.bench_assets import SHAPES, Shape

    tiny = Shape(name="tiny", tokenizer="char", vocab_size=0, hidden=32, layers=2, heads=2, intermediate=64,
                 prompt_tokens=(6, 12), max_new_tokens=8)  # fmt: skip
    res = bench_shape(tiny if dry else SHAPES["M"], root=assets / "bench", warmup=2, steps=2 if dry else 5, k=4,
                      batch_size=8, beta=0.05, lr=1e-6, seed=0, threads=threads(), peak=1.0,
                      trainers=["rloo"], device=device, dtype=bench_dtype("bfloat16", device), staleness=[0, 1],
                      log=print)  # fmt: skip
    r0, r1 = res["results"]["rloo"], res["results"]["rloo-n1"]
    return {"shape": res["shape"], "dtype": res["dtype"], "warmup": res["warmup"], "step_s_n0": r0["median_s"],
            "step_s_n1": r1["median_s"], "times_s_n0": r0["times_s"], "times_s_n1": r1["times_s"],
            "n0_over_n1": res["async_speedups"]["rloo-n1"], "lags_n1": r1["lags"], "phases_n1": r1["phases_s"],
            "peak_gb_n0": r0["peak_rss_gb"], "peak_gb_n1_trainer": r1["peak_rss_gb"]}  # fmt: skip


def async_steps(device: str, dry: bool, assets: Path) -> dict:
    train = async_train(device, assets)
    try:
        timing = async_bench(device, dry, assets)
    except Exception as e:  # noqa: BLE001 - the train run's result is kept; the error is the finding
        timing = {"error": f"{type(e).__name__}: {e}"}
    ok = train["ok"] and "error" not in timing and timing["lags_n1"] == [1.0] * len(timing["lags_n1"])
    return {"train": train, "timing": timing, "ok": ok}
