"""The weights after every update (rloo.runtime.paramguard) and the settings that produce bad ones:
`lr=inf`, `lr=1e308`, `beta=inf`, `lr: .inf` are refused before anything is written; an update
that leaves non-finite or exploding weights or optimizer state is undone (exactly like a skipped
step); a run that diverges ends with finite checkpoints; a run that never updated saves no model."""

from __future__ import annotations

import json

import pytest
import torch

import rloo.algorithms.rloo as rl
from rloo import train
from rloo.cli import main
from rloo.errors import NonFiniteError
from rloo.runtime.checkpoint.verify import list_checkpoints, load_state, step_of

from ._helpers import PROMPTS, assert_same_params, params, reward_short
from .conftest import rl_config as _cfg
from .test_bad_input import TINY_RUN, _one_line
from .test_guard import _nan_loss_on


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["lr=inf"], "lr: Input should be a finite number"),
        (["lr=1e308"], "lr: Input should be less than or equal to 1"),
        (["beta=inf"], "beta: Input should be a finite number"),
        (["max_grad_norm=nan"], "max_grad_norm: Input should be a finite number"),
        (["max_grad_norm=1e9"], "max_grad_norm: Input should be less than or equal to 1000000"),
        ("yaml", "lr: Input should be a finite number"),
    ],
)
def test_absurd_settings_are_refused_before_anything_is_written(extra, needle, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    if extra == "yaml":
        (tmp_path / "c.yaml").write_text("lr: .inf\nsteps: 2\n")
        extra = ["--config", str(tmp_path / "c.yaml")]
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=reliability._helpers:reward_short",
            f"output_dir={out}",
            *TINY_RUN,
            *extra,
        ]
    )
    _one_line(rc, capsys.readouterr().err.strip(), "rloo train: error: invalid config: ", needle)
    assert not out.exists()


def _poison_after_update(monkeypatch, calls_from: int, how: str, until: int = 10**9):
    """Damage the weights (or AdamW's moments) right after the optimizer update of rloo_step calls
    calls_from..until (1-based): what an absurd lr or a diverging step does to them."""
    n = {"calls": 0}
    real = rl.rloo_step

    def step(models, opt, *a, **kw):
        n["calls"] += 1
        out = real(models, opt, *a, **kw)
        if calls_from <= n["calls"] <= until:
            with torch.no_grad():
                p = next(q for q in models.policy.parameters() if q.requires_grad)
                if how == "nan weight":
                    p.view(-1)[0] = float("nan")
                elif how == "exploding weights":
                    for q in models.policy.parameters():
                        q.mul_(1e3)
                else:  # a non-finite optimizer moment
                    opt.state[p]["exp_avg_sq"].view(-1)[0] = float("inf")
        return out

    monkeypatch.setattr(rl, "rloo_step", step)


@pytest.mark.parametrize("how", ["nan weight", "exploding weights", "inf optimizer moment"])
def test_a_bad_update_is_undone_exactly_like_a_skipped_step(how, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Undoing step 2's update from the pre-step copy leaves weights and optimizer exactly as a
    step whose update was skipped (NaN loss) would: the two runs end bitwise equal."""
    skipped, undone = tmp_path / "skipped", tmp_path / "undone"
    _nan_loss_on(monkeypatch, {2})
    train(_cfg(tiny_model_dir, skipped, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short)
    monkeypatch.undo()
    _poison_after_update(monkeypatch, 2, how, until=2)
    train(_cfg(tiny_model_dir, undone, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short)
    assert "step 2: " in capsys.readouterr().err
    recs = [json.loads(x) for x in (undone / "metrics.jsonl").read_text().splitlines()]
    assert [r["guard/skipped"] for r in recs] == [0, 1, 0, 0, 0, 0]
    assert [r["guard/params_undone"] for r in recs] == [0, 1, 0, 0, 0, 0]
    assert_same_params(skipped / "model", undone / "model")
    assert torch.equal(
        load_state(undone / "checkpoints" / "step-000006")["optimizer"]["state"][0]["exp_avg_sq"],
        load_state(skipped / "checkpoints" / "step-000006")["optimizer"]["state"][0]["exp_avg_sq"],
    )


def test_a_run_that_diverges_midway_stops_with_finite_checkpoints(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _poison_after_update(monkeypatch, 3, "nan weight")  # every update from step 3 on goes bad
    with pytest.raises(
        NonFiniteError,
        match=r"2 steps in a row \(steps 3-4\) had a non-finite loss or gradient "
        r"or bad parameters \(last: non-finite parameters after the update\); "
        r"stopped\. Checkpoint from before the problem: .*step-000002",
    ):
        train(_cfg(tiny_model_dir, out, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short)
    assert [step_of(c) for c in list_checkpoints(out)] == [2]
    for ckpt in list_checkpoints(out):
        assert all(torch.isfinite(t).all() for t in params(ckpt / "model").values()), ckpt
        assert all(
            torch.isfinite(t).all() for st in load_state(ckpt)["optimizer"]["state"].values() for t in st.values()
        )
    assert not (out / "model").exists()


def test_a_run_whose_every_step_was_skipped_saves_no_model(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _nan_loss_on(monkeypatch, set(range(1, 100)))
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=reliability._helpers:reward_short",
            f"output_dir={out}",
            *TINY_RUN,
            "save_every=null",
            "max_skipped_steps=5",
        ]
    )
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        "every step was skipped (2 of 2",
        "no model was saved",
        progress_before=True,
    )
    assert not (out / "model").exists()
