"""Advantages and losses are registered by name (rloo.core.estimators) and a method names one of each:
an advantage and a loss added in one place each (a decorated function) make a new method with one
table entry, trained by the shared clipped-group step, no step of its own."""

from __future__ import annotations

import math

import pytest
import torch

from rloo import RLConfig, train
from rloo.algorithms import REGISTRY, STEPS, add_method
from rloo.config import METHOD_SPECS, MethodSpec
from rloo.config.method_settings import GRPOSettings
from rloo.core.estimators import ADVANTAGES, LOSSES, AdvantageInputs, register_advantage, register_loss
from rloo.core.logprobs import masked_mean

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :"]


def _short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


@pytest.fixture
def registries():
    """The estimators, the method table and the steps as they were, after a test that adds to them."""
    saved = [(d, dict(d)) for d in (ADVANTAGES, LOSSES, METHOD_SPECS, STEPS)]
    yield
    for d, before in saved:
        d.clear()
        d.update(before)


def _inputs(scores, k, valid=None):
    n = scores.shape[0]
    mask = torch.ones(n, 3, dtype=torch.bool)
    valid = torch.ones(n, dtype=torch.bool) if valid is None else valid
    zeros = torch.zeros(n, 3)
    return AdvantageInputs(scores, scores, valid, torch.ones(n, dtype=torch.bool), zeros, zeros, mask, k)


def test_the_built_in_estimators_by_name_on_hand_numbers():
    # groups (1, 3) and (2, 2): group means 2 and 2
    x = _inputs(torch.tensor([1.0, 3.0, 2.0, 2.0]), k=2)
    assert ADVANTAGES["group_mean"](x, {}).tolist() == [-1.0, 1.0, 0.0, 0.0]
    # leave-one-out: A_i = R_i - R_other = (-2, 2), (0, 0)
    assert ADVANTAGES["leave_one_out"](x, {}).tolist() == [-2.0, 2.0, 0.0, 0.0]
    # normalized by the group std (sqrt(2), sample std): -1/sqrt(2) * ... = (-0.7071, 0.7071); constant group 0
    got = ADVANTAGES["group_normalized"](x, {})
    assert torch.allclose(got, torch.tensor([-(2**-0.5), 2**-0.5, 0.0, 0.0]), atol=1e-5)
    assert {"clip_k3", "clip_k3_constant_length", "clip"} <= set(LOSSES)
    assert not LOSSES["clip_k3_constant_length"].token_mean and LOSSES["clip"].token_mean


def test_every_method_names_registered_estimators_or_a_step_of_its_own():
    for name, spec in METHOD_SPECS.items():
        if spec.online:
            assert spec.step in STEPS and name in REGISTRY
            assert spec.advantage is None or spec.advantage in ADVANTAGES
            assert spec.loss is None or spec.loss in LOSSES


def test_a_name_registered_twice_or_missing_is_refused(registries):
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("group_mean")(lambda x, hp: x.scores)
    with pytest.raises(ValueError, match="no advantage estimator 'nope'"):
        add_method(MethodSpec("toy_missing", "", GRPOSettings, advantage="nope", loss="clip"))
    assert "toy_missing" not in METHOD_SPECS


def test_an_advantage_and_a_loss_added_in_one_place_train_a_method(registries, tiny_model_dir, tmp_path):
    seen = {}

    @register_advantage("toy_batch_centered")
    def batch_centered(x: AdvantageInputs, hp) -> torch.Tensor:
        """A_i = score_i - mean score of the batch (its scored rows)."""
        seen["k"] = x.k
        return torch.where(x.valid, x.scores - x.scores[x.valid].mean(), torch.zeros_like(x.scores))

    @register_loss("toy_token_pg", token_mean=True)
    def token_pg(lp, old, ref, advantages, mask, weights, hp):
        """-mean over policy tokens of A_i * hp scale * log pi: no ratio, no clip."""
        loss = -masked_mean(advantages[:, None] * hp["toy_scale"] * lp, mask)
        return loss, {"toy/loss": loss.detach()}

    class ToySettings(GRPOSettings):
        toy_scale: float = 2.0

    add_method(MethodSpec("toy_centered", "", ToySettings, advantage="toy_batch_centered", loss="toy_token_pg"))
    assert METHOD_SPECS["toy_centered"].step == "clipped_group"
    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        algorithm="toy_centered",
        steps=2,
        batch_size=2,
        k=2,
        max_new_tokens=5,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
    )
    result = train(cfg, prompts=PROMPTS, reward_fn=_short)
    steps = [h for h in result.history if "reward/score" in h]
    assert len(steps) == 2 and seen["k"] == 2
    assert all(math.isfinite(h["toy/loss"]) and "adv/std" in h for h in steps)  # its loss's stats, logged
