"""The determinism statement of docs/cli.md ("What is deterministic") as measured: two identical
`rloo train` processes give bitwise the same metrics and weights, with one thread on every CPU kind and
with two where rloo promises it (`rloo.runtime.cpukind.THREADS_BITWISE_MEASURED`), under any
ATEN_CPU_CAPABILITY.

Why the second run's policy file is shifted: MKL's threaded sgemm took other code paths for operands
at other addresses (the same nn.Linear products differed in the last bits with 2 threads when the
weights moved by 8 bytes), and addresses differ between processes in ways two runs side by side need
not show, so the test moves every weight of the second run by 8 bytes (the safetensors header padded,
the tensors' bytes unchanged). rloo sets MKL's reproducibility mode (MKL_CBWR=AUTO) for this."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.child_env import child_env
from rloo.runtime.cpukind import THREADS_BITWISE_MEASURED, cpu_flags, cpu_kind

TESTS = str(Path(__file__).resolve().parents[1])
KIND = cpu_kind(cpu_flags())


def shifted_copy(model_dir: Path, dest: Path, shift: int = 8) -> Path:
    """A copy of a model folder whose model.safetensors holds the same tensors `shift` bytes further on
    (trailing spaces in the JSON header, which stays a multiple of 8 bytes long)."""
    shutil.copytree(model_dir, dest)
    raw = (model_dir / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n] + b" " * shift
    (dest / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])
    return dest


def _train(policy: Path, out: Path, threads: int) -> tuple[list[dict], dict]:
    env = child_env(TESTS, OMP_NUM_THREADS=str(threads))
    env.pop("MKL_CBWR", None)  # what rloo does by itself
    argv = [f"policy={policy}", "reward_fn=reliability._helpers:reward_short", "steps=4", "batch_size=4", "k=2"]
    argv += ["max_new_tokens=6", "eval_every=2", "eval_prompts=8", "save_every=null", "report_to=none"]
    cmd = [sys.executable, "-m", "rloo.cli", "train", *argv, f"output_dir={out}"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    metrics = [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in lines]
    return metrics, load_file(str(out / "model" / "model.safetensors"))


# 2 threads (13 s on a quiet machine, 77 s beside other work) in the slow tier: the 1-thread case runs the same code
@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_two_runs_are_bitwise_equal_where_promised(tiny_model_dir, tmp_path, threads):
    if threads > 1 and KIND not in THREADS_BITWISE_MEASURED:
        pytest.skip(f"bitwise repeats with {threads} threads are not promised on this CPU kind ({KIND})")
    moved = shifted_copy(tiny_model_dir, tmp_path / "moved")
    assert (
        load_file(str(moved / "model.safetensors")).keys()
        == load_file(str(tiny_model_dir / "model.safetensors")).keys()
    )
    (ma, wa), (mb, wb) = _train(tiny_model_dir, tmp_path / "a", threads), _train(moved, tmp_path / "b", threads)
    assert ma == mb, f"metrics differ between two identical {threads}-thread runs"
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa), f"weights differ ({threads} threads)"
