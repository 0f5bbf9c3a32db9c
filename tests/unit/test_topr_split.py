"""topr's split (rl.is_topr_split): rloo's rule truncates the samples with a negative leave-one-out
advantage, the TOPR paper's (arXiv 2503.14286) those with a negative reward. Gradients derived by hand
on four one-token sequences where the two rules disagree."""

from __future__ import annotations

import math

import pytest
import torch

from rloo.algorithms.offpolicy import weighted_loss
from rloo.config import RLConfig
from rloo.core.bounded import bounded_loss
from rloo.errors import ConfigError
from rloo.rollout.sampler import Rollout

# sample 1: A < 0 but R > 0 (a fair answer among better ones); sample 3: A > 0 but R < 0
A = [1.5, -1.5, 0.0, 1.5]
R = [3.0, 1.0, 2.0, -1.0]
LOG_RHO = [-0.5, -1.0, 0.3, -0.2]  # log pi - log mu per sequence (one token each)


def _grad(split_on: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
    lp = torch.tensor([[x] for x in LOG_RHO], dtype=torch.float64, requires_grad=True)
    mu = torch.zeros(4, 1, dtype=torch.float64)  # log mu = 0, so log rho = log pi
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv = torch.tensor(A, dtype=torch.float64)
    loss, stats = bounded_loss(lp, mu, mask, adv, "topr", clip=2.0, split_on=split_on)
    loss.backward()
    return lp.grad[:, 0], stats


def test_topr_splits_on_the_advantage_by_default_and_on_the_reward_when_asked():
    # loss = -1/N sum_i w_i A_i log pi_i, so d loss / d log pi_i = -w_i A_i / N (N = 4)
    # advantage split: w = (1, min(e^-1, 1), 1, 1); reward split: w = (1, 1, 1, min(e^-0.2, 1))
    by_adv = [-1.5 / 4, 1.5 * math.exp(-1.0) / 4, 0.0, -1.5 / 4]
    by_reward = [-1.5 / 4, 1.5 / 4, 0.0, -1.5 * math.exp(-0.2) / 4]
    got_adv, st_adv = _grad(None)
    got_reward, st_reward = _grad(torch.tensor(R, dtype=torch.float64))
    torch.testing.assert_close(got_adv, torch.tensor(by_adv, dtype=torch.float64))
    torch.testing.assert_close(got_reward, torch.tensor(by_reward, dtype=torch.float64))
    # is/clipped: the share truncated (negative side and rho < 1): sample 1, resp. sample 3
    assert float(st_adv["is/clipped"]) == float(st_reward["is/clipped"]) == 0.25


def _rollout() -> Rollout:
    ids = torch.zeros(4, 1, dtype=torch.long)
    return Rollout(
        prompts=["p"] * 4, completions=["c"] * 4, prompt_ids=ids, prompt_mask=torch.ones(4, 1, dtype=torch.bool),
        completion_ids=ids, completion_mask=torch.ones(4, 1, dtype=torch.bool),
        logprobs=torch.zeros(4, 1, dtype=torch.float64), truncated=torch.zeros(4, dtype=torch.bool), group_size=4,
    )  # fmt: skip


@pytest.mark.parametrize("split", ["advantage", "reward"])
def test_the_setting_reaches_the_loss(split):
    cfg = RLConfig(policy="x", k=4, max_staleness=1, is_correction="topr", is_topr_split=split)
    lp = torch.tensor([[x] for x in LOG_RHO], dtype=torch.float64, requires_grad=True)
    adv, rewards = torch.tensor(A, dtype=torch.float64), torch.tensor(R, dtype=torch.float64)
    weighted_loss(lp, _rollout(), adv, cfg, rewards=rewards)[0].backward()
    expected, _ = _grad(rewards if split == "reward" else None)
    torch.testing.assert_close(lp.grad[:, 0], expected, rtol=0, atol=0)  # the same computation


def test_is_topr_split_is_refused_beside_another_estimator():
    with pytest.raises(ConfigError, match="is_topr_split: for is_correction=topr, got tis"):
        RLConfig(policy="x", max_staleness=1, is_correction="tis", is_topr_split="reward")
