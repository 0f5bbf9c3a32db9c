"""An asynchronous run's checkpoint, bound and environment on bad input (docs/reliability.md
"Producer addresses, tampered rings, staleness bound, environment reset"): a ring/ whose versions
are not the policy's, or are missing, is refused on --resume in one line with nothing changed;
max_staleness is bounded and the ring never holds more than min(N, steps) + 1 versions; an
environment's reset that never returns stops the run in step_timeout_s."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tests.unit.test_envs import Good, _run

import rloo.runtime.inputs.sizes as sizes
from rloo.cli import main
from rloo.config import RLConfig
from rloo.errors import EnvError
from rloo.modeling.loading import load_policy
from rloo.rollout.lagged import LaggedSampler
from rloo.rollout.multiturn import Limits
from rloo.runtime.checkpoint.verify import MARKER
from rloo.runtime.runfolder.atomic import sync_and_hash

from .conftest import TRAIN
from .test_bad_input import _files, _one_line

RUN = [*TRAIN, "max_staleness=1"]  # the settings of the session's async_run (conftest.py)
CKPT = Path("checkpoints") / "step-000002"
RING = CKPT / "ring" / "version-000001.safetensors"


def _rehash(ckpt: Path) -> None:
    """A tampered checkpoint whose manifest was rewritten to match: only the content checks can tell."""
    (ckpt / MARKER).unlink()
    (ckpt / MARKER).write_text(json.dumps({"step": 2, "files": sync_and_hash(ckpt)}))


def _ring_file(path: Path, change) -> None:
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)


def _wrong_shape(t: dict) -> None:
    name = next(n for n in t if t[n].dim() == 2)
    t[name] = torch.zeros(t[name].shape[0] + 1, t[name].shape[1])


def _other_heads(run: Path) -> None:
    """The checkpoint's model said to have 4 heads of 8 instead of 2 of 16: the same shapes, other attention."""
    config = run / CKPT / "model" / "config.json"
    heads = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8}
    config.write_text(json.dumps(json.loads(config.read_text()) | heads))


TAMPER = {
    "wrong-shape": (lambda run: _ring_file(run / RING, _wrong_shape), "the policy's is ["),
    "missing-tensor": (lambda run: _ring_file(run / RING, lambda t: t.pop(sorted(t)[0])), "lacks "),
    "extra-tensor": (lambda run: _ring_file(run / RING, lambda t: t.update(x=torch.zeros(1))), "holds x, which"),
    "no-ring": (lambda run: shutil.rmtree(run / CKPT / "ring"), "has no ring/ folder"),
    "other-heads": (_other_heads, "configuration is not that of policy=/"),
}


@pytest.mark.parametrize("tamper", TAMPER, ids=list(TAMPER))
def test_a_tampered_ring_is_refused_on_resume(tamper, async_run, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    change, needle = TAMPER[tamper]
    change(run)
    _rehash(run / CKPT)
    before = _files(run)
    torch.set_num_threads(1)
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={run}", *RUN, "steps=3", "--resume"])
    err = capsys.readouterr().err.strip()
    _one_line(rc, err, f"cannot resume from {run / CKPT}", needle, progress_before=True)
    assert "exact continuation):" not in err  # no claim before the refusal
    assert _files(run) == before, "nothing was changed"


def test_a_same_shape_model_of_another_configuration_is_not_taken_for_the_ring(async_run, tmp_path):
    """The ring file records its policy's configuration: another num_attention_heads is named."""
    from rloo.runtime.checkpoint.ringcheck import check_ring

    policy, _ = load_policy(str(async_run / CKPT / "model"))
    policy.config.num_attention_heads = 4  # the tensors' shapes are unchanged
    saved = {1: load_file(async_run / RING)}
    with pytest.raises(Exception, match="another configuration .num_attention_heads: 2 -> 4"):
        check_ring(async_run / CKPT, saved, policy, range(1, 2), [1], dtype_may_change=False)


def test_a_checkpoint_that_never_had_its_versions_says_plainly_it_is_not_exact(
    async_run, tiny_model_dir, tmp_path, capsys
):
    """A checkpoint from before state.pt listed its ring (or one written after a non-finite streak,
    whose ring had fewer versions) resumes, saying the continuation is not exact, never claiming it."""
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    shutil.rmtree(run / CKPT / "ring")
    state = torch.load(run / CKPT / "state.pt", weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "ring_versions"}, run / CKPT / "state.pt")
    _rehash(run / CKPT)
    torch.set_num_threads(1)
    assert main(["train", f"policy={tiny_model_dir}", f"output_dir={run}", *RUN, "steps=3", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "(not an exact continuation): steps: 2 -> 3" in err and "still an exact" not in err, err
    assert f"resuming from {run / CKPT} without weight version 1 (not in its ring/)" in err, err


# -- the bound on max_staleness ------------------------------------------------------------------


def test_the_ring_holds_at_most_steps_plus_one_versions(tiny_model_dir, tmp_path):
    """max_staleness=1000 on a 2-step run: every batch is sampled with version 0 (a lag of at most
    2), so 3 copies suffice; N + 1 = 1001 were allocated (2.1 GB for a 47 KB model at N = 30000)."""
    cfg = RLConfig(policy=str(tiny_model_dir), reward_fn="m:f", steps=2, max_staleness=1000, output_dir=tmp_path)
    policy, tok = load_policy(str(tiny_model_dir))
    assert LaggedSampler(policy, tok, cfg).ring.size == 3


def test_max_staleness_above_the_cap_is_one_line(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *RUN, "max_staleness=1000000000"])
    _one_line(rc, capsys.readouterr().err.strip(), "max_staleness: Input should be less than or equal to 1024")
    assert not out.exists()


def test_a_ring_beyond_memory_is_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """min(N, steps) + 1 copies of the weights plus the sampler's above half of the free memory:
    refused before a model loads (here one copy is said to take an eighth of it)."""
    monkeypatch.setattr(sizes, "weights_bytes", lambda model: sizes.free_memory("cpu") // 8)
    out = tmp_path / "out"
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *RUN, "steps=9", "max_staleness=8"])
    _one_line(rc, capsys.readouterr().err.strip(), "max_staleness=8: the asynchronous run keeps 10 copies")
    assert not out.exists()
    torch.set_num_threads(1)  # 3 copies of 8 fit: the check refuses only what cannot run
    assert main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *RUN, "steps=1", "max_staleness=8"]) == 0


# -- an environment's reset ----------------------------------------------------------------------


def test_a_reset_that_never_returns_stops_in_step_timeout():
    class SlowReset(Good):
        def reset(self, prompt):
            time.sleep(30)
            return [3, 4]

    t0 = time.monotonic()
    with pytest.raises(EnvError, match=r"^environment SlowReset.reset took longer than step_timeout_s=0.3 s$"):
        _run(SlowReset, Limits(max_turns=2, max_turn_tokens=2, max_total_tokens=8, step_timeout_s=0.3))
    assert time.monotonic() - t0 < 10  # the slow reset (30 s) was not awaited
