"""Shared fixtures: a tiny Llama and word tokenizer saved in Hugging Face format to a temp folder."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from helpers.xdist_groups import suffix_group, xdist_groups
from rloo.config import ArchConfig
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

# dtype=auto would pick bf16 autocast on a CPU with fast bf16 matmuls (rloo.runtime.precision); the tests
# compare fast paths with plain ones in fp32 and must mean the same on every CPU, so auto is pinned to
# float32 here (the environment is inherited by the CLI subprocesses the tests start). The bf16 paths
# are tested with an explicit dtype (tests/equivalence/test_precision.py). Set RLOO_AUTO_DTYPE to override.
os.environ.setdefault("RLOO_AUTO_DTYPE", "float32")

# The test tiers are folders; each test gets its folder's marker (`pytest -m unit`, `-m "not integration"`).
TIERS = ("unit", "equivalence", "integration", "reliability")


# tryfirst: before the `-m` selection (which reads the tier marks) and pytest-xdist's worker (which reads
# the xdist_group marks)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    for item, group in zip(items, xdist_groups(items), strict=True):
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker sends the node ids to the scheduler
def pytest_collection_finish(session):
    if session.config.getoption("loadgroup", default=False):  # xdist may be off (-p no:xdist)
        for item in session.items:
            if "@" not in item.nodeid:  # xdist's own suffix did not reach it (helpers/xdist_groups.py)
                (mark,) = item.iter_markers("xdist_group")
                suffix_group(item, mark.args[0])


TINY = ArchConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A freshly initialised tiny Llama + the summarize task's tokenizer, saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny") / "model"
    tok = build_tokenizer(get_task("summarize"))
    model = build_llama(TINY, tok, seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# Intra-op threads for every test: 2 unless RLOO_TEST_THREADS says otherwise. The suite must pass
# with 1 and 2 threads (and any ATEN_CPU_CAPABILITY): reductions split over threads round
# differently, which the tolerances (tests/tolerance.py) allow for.
# Under pytest-xdist (`make test`: two workers on a 2-core machine) each worker, and every process its
# tests start (OMP_NUM_THREADS is inherited), uses 1: two workers of 2 threads each would oversubscribe
# the cores. The 2-thread arithmetic is then checked where the suite runs without -n (.ci/run runs
# the equivalence tier once more so).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("RLOO_TEST_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["RLOO_TEST_THREADS"])
THREADS = int(os.environ.get("RLOO_TEST_THREADS", "2"))
# The processes tests start (`python -m rloo.cli`, torchrun) use the same count, given as the user's:
# without it the CLI would choose one from the machine's load (rloo.runtime.threadpolicy), and a
# child's run compared with this process's would depend on what else the machine runs.
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
# Also at import, before any fixture runs: session fixtures (the reliability tests' never-stopped
# reference run) are built before the per-test fixture below sets the count, so they ran with the
# process's default (OMP_NUM_THREADS, or every core) and a resumed run compared with them used 2:
# bitwise comparisons failed by 3.7e-9 under OMP_NUM_THREADS=1 (any default other than 2 can do this).
torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)
    yield


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state, whatever ran before it in its process:
    under xdist the order of tests in a worker changes from run to run, and a draw from the global
    generator (peft's LoRA init, a model's init) then changed with it. Once in a full run this gave a
    case of test_offpolicy_methods.py LoRA adapters under which mis masked every sequence (a zero
    gradient, refused by its scale check)."""
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_leaked_optimizer():
    """A test that swaps rloo's optimizer factory in-process must put it back: a leaked SGD once made
    later tests that rely on AdamW fail only in the full suite (tests/helpers/dist_worker.py)."""
    import rloo.training.rl as rl

    adamw = rl.adamw
    yield
    assert rl.adamw is adamw, "this test left rloo.training.rl.adamw replaced"


@pytest.fixture(scope="session")
def tuned_study(tmp_path_factory):
    """The suite's one tuned tiny comparison (tests/helpers/tuned_study.py; read-only: copy it first)."""
    from helpers.tuned_study import run_tuned_study

    return run_tuned_study(tmp_path_factory.mktemp("tuned"))
