"""Run by tests/equivalence/test_distributed.py under `torchrun --nproc_per_node 2` (and in-process as the
one-process reference): a few RLOO steps on a tiny model for each parallel mode given."""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

# every prompt is the same number of tokens, so each process pads its prompts exactly as the
# one-process run does and the forward passes see identical inputs
PROMPTS = [
    "post : job rent tl;dr :",
    "post : exam car tl;dr :",
    "post : loan sister tl;dr :",
    "post : dog fence tl;dr :",
    "post : rent car tl;dr :",
    "post : sister job tl;dr :",
]


def reward_short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


def config(model_dir: str, out: Path, parallel: str, micro: bool = False, lag: int = 0, **over):
    """micro: gradient accumulation, one prompt's group per forward/backward (2 per process). lag:
    rl.max_staleness (the sampler in the process with 1 thread, the producer process with 2).
    over: other settings (steps, save_every)."""
    from rloo import RLConfig

    settings = dict(
        micro_batch_size=1 if micro else None,
        policy=model_dir,
        output_dir=out,
        steps=3,
        batch_size=4,
        k=2,
        max_new_tokens=6,
        lr=1e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        parallel=parallel,
        seed=3,
        max_staleness=lag,
    )
    return RLConfig(**(settings | over))


@contextmanager
def _sgd_instead_of_adamw():
    """Plain SGD for the comparison: its update lr * g is as well-conditioned as g, while AdamW's
    first update lr * g / (|g| + 1e-8) turns float32 rounding in near-zero gradient entries
    into parameter differences of up to lr (tests/tolerance.py). Restored on exit: the one-process
    reference runs inside pytest, and a leaked SGD made later tests that expect AdamW fail
    (no learning in test_reward_fn_cli, no optimizer moments in test_param_guard)."""
    import torch

    import rloo.training.rl as rl

    adamw = rl.adamw
    rl.adamw = lambda params, lr: torch.optim.SGD([p for p in params if p.requires_grad], lr=lr)
    try:
        yield
    finally:
        rl.adamw = adamw


@contextmanager
def _grouped_everywhere(out_root: str, rank: int):
    """Grouped attention (rloo.modeling.attention.grouped_attention) wherever it can run, as the
    tiny model never reaches its size threshold; its calls are counted into
    out_root/grouped_calls.<rank>, so the test can tell that it ran."""
    import rloo.modeling.attention as attention
    import rloo.modeling.kvcache as kvcache

    threshold, original, calls = kvcache.GROUPED_MIN_ELEMENTS, attention.grouped_attention, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    kvcache.GROUPED_MIN_ELEMENTS, attention.grouped_attention = 0, counted
    try:
        yield
    finally:
        kvcache.GROUPED_MIN_ELEMENTS, attention.grouped_attention = threshold, original
        (Path(out_root) / f"grouped_calls.{rank}").write_text(str(calls[0]))


def run(
    model_dir: str,
    out_root: str,
    modes: list[str],
    grouped: bool = False,
    micro: bool = False,
    lag: int = 0,
    resume: bool = False,
    **over,
) -> None:
    import os

    from rloo import train

    Path(out_root).mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    with _sgd_instead_of_adamw(), _grouped_everywhere(out_root, rank) if grouped else nullcontext():
        for mode in modes:
            cfg = config(model_dir, Path(out_root) / mode, mode, micro, lag, **over)
            train(cfg, prompts=PROMPTS, reward_fn=reward_short, resume=resume)


def run_job(job: dict) -> None:
    """One entry of a launch's job list: {"worker": "dist" | "dropout", "model", "out", "modes", "flags"},
    flags as `torchrun()` takes them (grouped, micro, resume, name=integer settings)."""
    if job.get("worker", "dist") == "dropout":
        import dropout_dist_worker

        dropout_dist_worker.run(job["model"], job["out"], job["modes"])
        return
    if job.get("worker") == "release":
        release_job(job["model"], job["out"])
        return
    flags = job.get("flags", [])
    ints = {k: int(v) for k, v in (f.split("=") for f in flags if "=" in f)}
    lag = ints.pop("lag", 0)
    run(job["model"], job["out"], job["modes"], "grouped" in flags, "micro" in flags, lag, "resume" in flags, **ints)


def release_job(model_dir: str, out_root: str) -> None:
    """One DDP run with the collector off (cycles are then freed only where rloo collects them);
    writes out_root/ddp_left.<rank>: how many DDP wrappers are still alive once train() returned.
    One left alive holds the process group's Gloo threads to interpreter shutdown (Dist.close)."""
    import gc
    import os

    from torch.nn.parallel import DistributedDataParallel

    gc.disable()
    try:
        run(model_dir, out_root, ["ddp"], steps=1)
        left = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    finally:
        gc.enable()
    (Path(out_root) / f"ddp_left.{os.environ.get('RANK', '0')}").write_text(str(left))


def torchrun(jobs: list[dict], threads: int = 1) -> None:
    """The jobs, in order, in ONE `torchrun --nproc_per_node 2` launch (gloo) of this file, `threads`
    intra-op threads each: a launch costs two interpreters importing torch and rloo and a rendezvous,
    more than a tiny run, so the suite starts one per world size rather than one per test."""
    import json
    import os
    import subprocess
    import tempfile

    from helpers.child_env import child_env

    here = Path(__file__).parent
    env = child_env(here, OMP_NUM_THREADS=str(threads))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{**j, "model": str(j["model"]), "out": str(j["out"])} for j in jobs], f)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    # --standalone: torchrun binds a free port itself, no window for another process to take it
    cmd += ["--standalone", str(here / "dist_worker.py"), f.name]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        os.unlink(f.name)
    assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
    import json

    import torch.distributed as dist

    # one process group for every run: train() joins a group it did not create and leaves it
    # alone (re-creating gloo groups back to back in one launch is flaky)
    dist.init_process_group("gloo")
    try:
        for job in json.loads(Path(sys.argv[1]).read_text()):
            run_job(job)
    finally:
        import gc

        gc.collect()  # as rloo's Dist.close: the group's Gloo threads end now, not in interpreter shutdown
        dist.destroy_process_group()
