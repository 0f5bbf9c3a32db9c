"""The tier's two-process (torchrun) runs, all in ONE launch: each test names the jobs it compares with
`@pytest.mark.two_process_jobs(name)`, and the session fixture `two_process_runs` starts one
`torchrun --nproc_per_node 2` for every job that the selected tests name (a launch costs two
interpreters importing torch and rloo plus a rendezvous, more than a tiny run: one per test took
15-38 s each)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))
import dist_worker  # noqa: E402

from helpers.tiny_archs import save_tiny_lm  # noqa: E402

# name -> (model, modes, flags, worker): tests/helpers/dist_worker.py's run_job; model is a key of the
# fixture's model folders
JOBS = {
    "expanded": ("tiny", ["ddp", "fsdp"], [], "dist"),
    "grouped": ("sharp", ["ddp", "fsdp"], ["grouped"], "dist"),
    "micro": ("tiny", ["ddp", "fsdp"], ["micro"], "dist"),
    "lagged-in-process": ("tiny", ["ddp"], ["lag=1"], "dist"),
    "dropout": ("gpt2_dropout", ["ddp", "fsdp", "ddp-gc"], [], "dropout"),
    "release": ("tiny", ["ddp"], [], "release"),
}


def pytest_configure(config):
    config.addinivalue_line("markers", "two_process_jobs(*names): the test reads these runs of two_process_runs")


def sharp_attention_copy(model_dir: Path, out: Path, factor: float = 8.0) -> Path:
    """The model with its query and key projections scaled by `factor`: a freshly initialised model
    attends almost uniformly, so which keys a row reads barely changes its tokens (checked: grouped
    attention reading the wrong prompt's keys moved this test's parameters by 2e-7, within its
    tolerance); with sharper attention it changes them."""
    from transformers import AutoModelForCausalLM

    from rloo.runtime.inputs.saved_tokenizer import auto_tokenizer  # the folder's tokenizer as saved, any architecture

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(factor)
    model.save_pretrained(out)
    auto_tokenizer(str(model_dir)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def gpt2_dropout(tmp_path_factory):
    """A tiny GPT-2 with dropout 0.1 in every dropout key of its config."""
    return save_tiny_lm(tmp_path_factory.mktemp("gpt2d") / "model", "gpt2", dropout=0.1)


@pytest.fixture(scope="session")
def two_process_runs(request, tiny_model_dir, gpt2_dropout, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (model folder, run root with one folder per mode) for every job the selected tests name."""
    wanted: list[str] = []
    for item in request.session.items:
        for mark in item.iter_markers("two_process_jobs"):
            wanted += [n for n in mark.args if n not in wanted]
    root = tmp_path_factory.mktemp("two-processes")
    models = {"tiny": tiny_model_dir, "gpt2_dropout": gpt2_dropout}
    if "grouped" in wanted:
        models["sharp"] = sharp_attention_copy(tiny_model_dir, root / "sharp")
    runs = {n: (models[JOBS[n][0]], root / n) for n in wanted}
    jobs = [
        {"model": runs[n][0], "out": runs[n][1], "modes": JOBS[n][1], "flags": JOBS[n][2], "worker": JOBS[n][3]}
        for n in wanted
    ]
    if jobs:
        dist_worker.torchrun(jobs)
    return runs
